#pragma once
// The TLS and bearer-token flags every HLEM binary and `hlem` command that speaks gRPC accepts
// (common/grpc_security.h; docs/reliability.md, "Access"). Check the result with
// ResolveChannelOptions / TlsConfig::Validate after parsing.

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_security.h"
#include "common/grpc_server.h"

namespace hlem {

// --tls off|tls|mtls, --tls-cert, --tls-key, --tls-ca, --tls-server-name, --tls-refresh-s.
inline void AddTlsFlags(CLI::App& app, TlsConfig* tls) {
  const std::map<std::string, TlsMode> modes{
      {"off", TlsMode::kOff}, {"tls", TlsMode::kTls}, {"mtls", TlsMode::kMutual}};
  app.add_option("--tls", tls->mode,
                 "gRPC transport security: off (plaintext), tls (servers prove who they are), "
                 "mtls (and clients too); the health port stays plaintext")
      ->transform(CLI::CheckedTransformer(modes));
  app.add_option("--tls-cert", tls->cert_file,
                 "PEM certificate this process serves and dials with");
  app.add_option("--tls-key", tls->key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", tls->ca_file,
                 "PEM CA certificate(s) the peers' certificates chain to");
  app.add_option("--tls-server-name", tls->server_name,
                 "name to check in servers' certificates instead of the address's host");
  app.add_option_function<double>(
         "--tls-refresh-s", [tls](double s) { tls->refresh = absl::Seconds(s); },
         "how often the certificate files are re-read (rotation without a restart)")
      ->check(CLI::Range(1.0, 86400.0));
}

// --grpc-max-threads: GrpcServerOptions::max_threads of every server the binary runs.
inline void AddServerThreadsFlag(CLI::App& app, int* max_threads) {
  app.add_option("--grpc-max-threads", *max_threads,
                 "most threads each gRPC server runs calls on; beyond them calls are refused "
                 "with RESOURCE_EXHAUSTED at once (0 = unbounded)")
      ->check(CLI::Range(0, 1 << 20));
}

// A client's channel: --tls* plus a token flag (`token_flag`, e.g. "--admin-token-file") whose
// file's content is sent as 'authorization: Bearer <token>'.
struct ClientSecurityFlags {
  TlsConfig tls;
  std::string token_file;
};

inline void AddClientSecurityFlags(CLI::App& app, ClientSecurityFlags* flags,
                                   const std::string& token_flag, const std::string& token_help) {
  AddTlsFlags(app, &flags->tls);
  app.add_option(token_flag, flags->token_file, token_help);
}

// Validates the TLS files and opens the token file; errors name the flag.
inline absl::StatusOr<ChannelOptions> ResolveChannelOptions(const ClientSecurityFlags& flags,
                                                            const std::string& token_flag,
                                                            int max_message_bytes = 64 << 20) {
  if (auto s = flags.tls.Validate(/*client_only=*/true); !s.ok()) return s;
  ChannelOptions options{.max_message_bytes = max_message_bytes, .tls = flags.tls};
  if (!flags.token_file.empty()) {
    auto token = TokenFile::Open(flags.token_file);
    if (!token.ok()) {
      return absl::Status(token.status().code(),
                          absl::StrCat(token_flag, ": ", token.status().message()));
    }
    options.token = std::move(*token);
  }
  return options;
}

// Whether a listen address is reachable from this host only (IPv4 127/8, [::1], localhost, a
// unix socket). "" (no port) counts as loopback.
inline bool IsLoopbackAddress(const std::string& address) {
  return address.empty() || address.rfind("127.", 0) == 0 || address.rfind("[::1]:", 0) == 0 ||
         address.rfind("localhost:", 0) == 0 || address.rfind("unix:", 0) == 0;
}

// A server's required token: null when `path` is "" (no check).
inline absl::StatusOr<std::shared_ptr<TokenFile>> OpenRequiredToken(const std::string& path,
                                                                    const std::string& flag) {
  if (path.empty()) return std::shared_ptr<TokenFile>();
  auto token = TokenFile::Open(path);
  if (!token.ok()) {
    return absl::Status(token.status().code(), absl::StrCat(flag, ": ", token.status().message()));
  }
  return token;
}

}  // namespace hlem
