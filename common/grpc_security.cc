#include "common/grpc_security.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace hlem {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// The flag names a file and the file holds a PEM block of the kind wanted.
absl::Status CheckPem(absl::string_view flag, const std::string& path, absl::string_view what,
                      absl::string_view marker) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": required with TLS on"));
  absl::StatusOr<std::string> content = ReadFile(path);
  if (!content.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", content.status().message()));
  }
  if (!absl::StrContains(*content, marker)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " holds no PEM ", what, " (no '", marker, "')"));
  }
  return absl::OkStatus();
}

unsigned RefreshSeconds(const TlsConfig& tls) {
  return static_cast<unsigned>(std::clamp<int64_t>(absl::ToInt64Seconds(tls.refresh), 1, 86400));
}

// Constant time in the token's content (not its length).
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::Status TlsConfig::Validate(bool client_only) const {
  if (!enabled()) return absl::OkStatus();
  if (!client_only || mode == TlsMode::kMutual) {
    if (auto s = CheckPem("--tls-cert", cert_file, "certificate", "-----BEGIN CERTIFICATE-----");
        !s.ok()) {
      return s;
    }
    if (auto s = CheckPem("--tls-key", key_file, "private key", "PRIVATE KEY-----"); !s.ok()) {
      return s;
    }
  }
  if (auto s = CheckPem("--tls-ca", ca_file, "certificate", "-----BEGIN CERTIFICATE-----");
      !s.ok()) {
    return s;
  }
  if (refresh < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--tls-refresh-s: at least 1 second");
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsConfig& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  using grpc::experimental::FileWatcherCertificateProvider;
  auto provider = tls.mode == TlsMode::kMutual
                      ? std::make_shared<FileWatcherCertificateProvider>(
                            tls.key_file, tls.cert_file, tls.ca_file, RefreshSeconds(tls))
                      : std::make_shared<FileWatcherCertificateProvider>(
                            tls.key_file, tls.cert_file, RefreshSeconds(tls));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (tls.mode == TlsMode::kMutual) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsConfig& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  using grpc::experimental::FileWatcherCertificateProvider;
  auto provider =
      tls.mode == TlsMode::kMutual
          ? std::make_shared<FileWatcherCertificateProvider>(tls.key_file, tls.cert_file,
                                                             tls.ca_file, RefreshSeconds(tls))
          : std::make_shared<FileWatcherCertificateProvider>(tls.ca_file, RefreshSeconds(tls));
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (tls.mode == TlsMode::kMutual) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

void AddTlsChannelArguments(const TlsConfig& tls, grpc::ChannelArguments* args) {
  if (tls.enabled() && !tls.server_name.empty()) {
    args->SetSslTargetNameOverride(tls.server_name);
  }
}

absl::StatusOr<std::shared_ptr<TokenFile>> TokenFile::Open(std::string path,
                                                           absl::Duration recheck) {
  if (path.empty()) return absl::InvalidArgumentError("token file: empty path");
  std::shared_ptr<TokenFile> file(new TokenFile(std::move(path), recheck));
  absl::StatusOr<std::optional<Loaded>> loaded = file->ReadIfChanged(Identity{});
  if (!loaded.ok()) return loaded.status();
  absl::MutexLock lock(&file->mu_);
  file->Apply(std::move(**loaded));
  file->next_check_ = absl::Now() + recheck;
  return file;
}

std::shared_ptr<TokenFile> TokenFile::Fixed(std::string token) {
  std::shared_ptr<TokenFile> file(new TokenFile("", absl::InfiniteDuration()));
  absl::MutexLock lock(&file->mu_);
  file->token_ = std::move(token);
  file->next_check_ = absl::InfiniteFuture();
  return file;
}

absl::StatusOr<std::optional<TokenFile::Loaded>> TokenFile::ReadIfChanged(
    const Identity& seen) const {
  struct stat st = {};
  if (::stat(path_.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("token file ", path_, ": cannot stat"));
  }
  if (st.st_mtim.tv_sec == seen.mtime.tv_sec && st.st_mtim.tv_nsec == seen.mtime.tv_nsec &&
      st.st_size == seen.size && st.st_ino == seen.inode) {
    return std::nullopt;
  }
  absl::StatusOr<std::string> content = ReadFile(path_);
  if (!content.ok()) return content.status();
  std::string token(absl::StripAsciiWhitespace(*content));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path_, ": empty"));
  }
  return Loaded{std::move(token), Identity{st.st_mtim, st.st_size, st.st_ino}};
}

void TokenFile::Apply(Loaded loaded) const {
  if (!token_.empty() && loaded.token != token_) {
    GetLogger("grpc")->info("token_reloaded file={}", path_);
  }
  token_ = std::move(loaded.token);
  identity_ = loaded.identity;
}

std::string TokenFile::Get() const {
  Identity seen;
  {
    absl::MutexLock lock(&mu_);
    if (reading_) {
      // Another call is re-reading the file: wait for its token (a rotated token must not be
      // accepted once the re-read is due), but not forever — a file system that hangs leaves the
      // last good token in force, and costs each call at most kReadWait.
      auto read = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !reading_; };
      mu_.AwaitWithTimeout(absl::Condition(&read), kReadWait);
      return token_;
    }
    if (absl::Now() < next_check_) return token_;
    reading_ = true;  // this call re-reads the file, without the lock
    seen = identity_;
  }
  absl::StatusOr<std::optional<Loaded>> loaded = ReadIfChanged(seen);
  absl::MutexLock lock(&mu_);
  reading_ = false;
  next_check_ = absl::Now() + recheck_;
  if (!loaded.ok()) {
    GetLogger("grpc")->warn("token_reload_failed file={} keeping=last_good error={}", path_,
                            std::string(loaded.status().message()));
  } else if (loaded->has_value()) {
    Apply(std::move(**loaded));
  }
  return token_;
}

grpc::Status CheckBearerToken(const grpc::ServerContext& context, const TokenFile* token,
                              absl::string_view service) {
  if (token == nullptr) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  constexpr absl::string_view kBearer = "Bearer ";
  if (it == metadata.end() || it->second.size() <= kBearer.size() ||
      !absl::StartsWithIgnoreCase(absl::string_view(it->second.data(), it->second.size()),
                                  kBearer)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat(service, ": needs 'authorization: Bearer <token>' metadata"));
  }
  const absl::string_view presented(it->second.data() + kBearer.size(),
                                    it->second.size() - kBearer.size());
  if (!SameSecret(absl::StripAsciiWhitespace(presented), token->Get())) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(service, ": this bearer token may not call it"));
  }
  return grpc::Status::OK;
}

}  // namespace hlem
