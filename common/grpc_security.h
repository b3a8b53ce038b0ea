#pragma once
// Transport security and call authorization for HLEM's gRPC channels (docs/reliability.md,
// "Access").
//
// TLS: one certificate/key pair per process, used both to serve (the public and admin ports; the
// health port stays plaintext for probes) and to dial; `ca_file` verifies the peer's certificate.
// Mutual TLS: servers also require a client certificate signed by that CA. The three files are
// watched (gRPC's FileWatcherCertificateProvider re-reads them every `refresh`): a rotated
// certificate or CA is used by new connections without a restart.
//
// Bearer tokens: a server checks `authorization: Bearer <token>` against a TokenFile
// (CheckBearerToken); a client attaches its TokenFile's value to every call of a channel
// (ChannelOptions::token in grpc_server.h). Tokens are re-read when their file changes. Without
// TLS a token crosses the network in the clear: use both where the network is not trusted.
//
//   ASSIGN_OR_RETURN(auto admin_token, hlem::TokenFile::Open("/etc/hlem/admin.token"));
//   grpc::Status Svc::SetAlpha(grpc::ServerContext* ctx, ...) {
//     if (auto s = hlem::CheckBearerToken(*ctx, token_.get(), "ServingNodeAdmin"); !s.ok())
//       return s;
//     ...

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"

namespace hlem {

enum class TlsMode {
  kOff,     // plaintext (the default: loopback and trusted networks)
  kTls,     // servers present their certificate, clients verify it
  kMutual,  // and clients present theirs, which servers require and verify
};

struct TlsConfig {
  TlsMode mode = TlsMode::kOff;
  std::string cert_file;  // PEM certificate (chain) of this process
  std::string key_file;   // PEM private key of cert_file
  std::string ca_file;    // PEM CA certificate(s) that sign the peers' certificates
  // Clients: the name checked against the server's certificate instead of the target's host ("" =
  // the host), e.g. one certificate for every pod naming "hlem.internal".
  std::string server_name;
  absl::Duration refresh = absl::Seconds(10);  // how often the files are re-read (≥ 1 s)

  bool enabled() const { return mode != TlsMode::kOff; }
  // With TLS on: every file named, readable and holding what it should (a PEM certificate, a PEM
  // private key); the error names the flag (--tls-cert, --tls-key, --tls-ca) and the path.
  // `client_only`: a process that only dials needs no certificate of its own with mode tls.
  absl::Status Validate(bool client_only = false) const;
};

// Insecure credentials when the mode is off. Validate() first: a missing file is not an error
// here (gRPC keeps retrying to read it and every handshake fails until it appears).
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsConfig& tls);
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsConfig& tls);
// Channel arguments the credentials need (the server name override).
void AddTlsChannelArguments(const TlsConfig& tls, grpc::ChannelArguments* args);

// A secret held in a file: its content with surrounding whitespace trimmed. Re-read when the
// file's modification time, size or inode changes (checked at most every `recheck`); a file that
// becomes unreadable or empty keeps the last good value (logged). Thread-safe.
class TokenFile {
 public:
  // NOT_FOUND / INVALID_ARGUMENT (empty file) naming the path.
  static absl::StatusOr<std::shared_ptr<TokenFile>> Open(
      std::string path, absl::Duration recheck = absl::Milliseconds(500));
  // A token not read from a file (tests, generated tokens); never changes.
  static std::shared_ptr<TokenFile> Fixed(std::string token);

  std::string Get() const;
  const std::string& path() const { return path_; }

 private:
  // What tells a changed file: modification time, size, inode.
  struct Identity {
    struct timespec mtime = {};
    off_t size = -1;
    ino_t inode = 0;
  };
  struct Loaded {
    std::string token;
    Identity identity;
  };
  TokenFile(std::string path, absl::Duration recheck) : path_(std::move(path)), recheck_(recheck) {}
  // The file's token, or nullopt when its identity is still `seen`. Without the lock: a slow
  // file system (a hung network mount) must not stall every call that checks a token.
  absl::StatusOr<std::optional<Loaded>> ReadIfChanged(const Identity& seen) const;
  void Apply(Loaded loaded) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;  // "" for Fixed
  const absl::Duration recheck_;
  mutable absl::Mutex mu_;
  mutable std::string token_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  mutable Identity identity_ ABSL_GUARDED_BY(mu_);
  // A call is re-reading the file (one at a time, so a slow read cannot apply an older content
  // over a newer one); the others wait for it up to kReadWait, then answer with the last token.
  mutable bool reading_ ABSL_GUARDED_BY(mu_) = false;
  static constexpr absl::Duration kReadWait = absl::Seconds(1);
};

// OK when `token` is null (no check) or the call carries `authorization: Bearer <token>`.
// UNAUTHENTICATED when it carries no bearer token; PERMISSION_DENIED when it carries another one
// (e.g. a frontend token at an admin service). `service` names what was refused in the message.
grpc::Status CheckBearerToken(const grpc::ServerContext& context, const TokenFile* token,
                              absl::string_view service);

}  // namespace hlem
