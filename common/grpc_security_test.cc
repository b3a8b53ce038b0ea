#include "common/grpc_security.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_flags.h"
#include "common/grpc_health_probe.h"
#include "common/grpc_server.h"
#include "echo.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hlem {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Test PKIs made by scripts/make-certs.sh: "a" and "b" are unrelated CAs, each with one
// certificate naming localhost, 127.0.0.1 and hlem.internal.
std::string Pki(const std::string& which, const std::string& file) {
  return absl::StrCat(HLEM_SOURCE_DIR, "/common/testdata/tls/", which, "/", file);
}

TlsConfig Tls(TlsMode mode, const std::string& identity, const std::string& ca) {
  return {.mode = mode,
          .cert_file = Pki(identity, "tls.crt"),
          .key_file = Pki(identity, "tls.key"),
          .ca_file = Pki(ca, "ca.crt"),
          .refresh = absl::Seconds(1)};
}

void WriteFile(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << content;
  fs::rename(tmp, path);  // atomic, as a Kubernetes Secret update is
}

// The public echo checks a frontend token, the admin echo the admin token (either may be null).
template <typename Base>
class CheckedEcho final : public Base {
 public:
  CheckedEcho(const TokenFile* token, std::string name) : token_(token), name_(std::move(name)) {}
  grpc::Status Echo(grpc::ServerContext* context, const test::EchoRequest* request,
                    test::EchoResponse* response) override {
    if (auto s = CheckBearerToken(*context, token_, name_); !s.ok()) return s;
    response->set_message(request->message());
    return grpc::Status::OK;
  }

 private:
  const TokenFile* token_;
  std::string name_;
};

class SecurityTest : public ::testing::Test {
 protected:
  // The server keeps the tokens until it has stopped (its handlers read them), as the binaries'
  // mains do.
  void Start(const TlsConfig& tls, std::shared_ptr<TokenFile> frontend = nullptr,
             std::shared_ptr<TokenFile> admin = nullptr) {
    tokens_ = {frontend, admin};
    echo_ = std::make_unique<CheckedEcho<test::Echo::Service>>(frontend.get(), "Echo");
    admin_ = std::make_unique<CheckedEcho<test::EchoAdmin::Service>>(admin.get(), "EchoAdmin");
    auto server = GrpcServer::Create({.listen = "127.0.0.1:0",
                                      .admin_listen = "127.0.0.1:0",
                                      .health_listen = "127.0.0.1:0",
                                      .tls = tls},
                                     {echo_.get()}, {admin_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  // One call on a fresh channel (no connection backoff carried over).
  grpc::Status Call(int port, const ChannelOptions& options, bool admin = false) {
    const std::string target = absl::StrCat("127.0.0.1:", port);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
    test::EchoRequest request;
    request.set_message("hi");
    test::EchoResponse response;
    grpc::Status status =
        admin
            ? test::EchoAdmin::NewStub(MakeChannel(target, options))
                  ->Echo(&context, request, &response)
            : test::Echo::NewStub(MakeChannel(target, options))->Echo(&context, request, &response);
    if (status.ok()) {
      EXPECT_EQ(response.message(), "hi");
    }
    return status;
  }
  grpc::Status Call(const ChannelOptions& options) { return Call(server_->port(), options); }

  std::vector<std::shared_ptr<TokenFile>> tokens_;
  std::unique_ptr<test::Echo::Service> echo_;
  std::unique_ptr<test::EchoAdmin::Service> admin_;
  std::unique_ptr<GrpcServer> server_;
};

TEST(TlsConfigTest, ParsesModesAndNamesTheBadFlag) {
  auto mode_of = [](const std::string& value) -> std::optional<TlsMode> {
    CLI::App app;
    TlsConfig tls;
    AddTlsFlags(app, &tls);
    try {
      app.parse(std::vector<std::string>{value, "--tls"});  // CLI11 reads the vector backwards
    } catch (const CLI::ParseError&) {
      return std::nullopt;
    }
    return tls.mode;
  };
  EXPECT_EQ(mode_of("off"), TlsMode::kOff);
  EXPECT_EQ(mode_of("tls"), TlsMode::kTls);
  EXPECT_EQ(mode_of("mtls"), TlsMode::kMutual);
  EXPECT_EQ(mode_of("ssl"), std::nullopt);

  EXPECT_TRUE(TlsConfig{}.Validate().ok());  // off needs no files
  EXPECT_TRUE(Tls(TlsMode::kMutual, "a", "a").Validate().ok());
  TlsConfig missing = Tls(TlsMode::kTls, "a", "a");
  missing.key_file.clear();
  EXPECT_THAT(std::string(missing.Validate().message()), HasSubstr("--tls-key: required"));
  TlsConfig client{.mode = TlsMode::kTls, .ca_file = Pki("a", "ca.crt")};
  EXPECT_TRUE(client.Validate(/*client_only=*/true).ok());  // a tls client needs only the CA
  EXPECT_FALSE(client.Validate().ok());                     // a server needs its certificate
  client.mode = TlsMode::kMutual;
  EXPECT_THAT(std::string(client.Validate(/*client_only=*/true).message()),
              HasSubstr("--tls-cert"));
  TlsConfig absent = Tls(TlsMode::kTls, "a", "a");
  absent.ca_file = "/nonexistent/ca.crt";
  EXPECT_THAT(std::string(absent.Validate().message()), HasSubstr("--tls-ca: cannot read"));
  TlsConfig swapped = Tls(TlsMode::kTls, "a", "a");
  std::swap(swapped.cert_file, swapped.key_file);
  EXPECT_THAT(std::string(swapped.Validate().message()), HasSubstr("--tls-cert"));
  TlsConfig fast = Tls(TlsMode::kTls, "a", "a");
  fast.refresh = absl::Milliseconds(100);
  EXPECT_THAT(std::string(fast.Validate().message()), HasSubstr("--tls-refresh-s"));
}

TEST_F(SecurityTest, TlsServesClientsThatTrustItsCaOnly) {
  Start(Tls(TlsMode::kTls, "a", "a"));
  EXPECT_TRUE(Call({.tls = Tls(TlsMode::kTls, "a", "a")}).ok());
  EXPECT_EQ(Call({}).error_code(), grpc::StatusCode::UNAVAILABLE);  // plaintext client
  EXPECT_EQ(Call({.tls = Tls(TlsMode::kTls, "a", "b")}).error_code(),
            grpc::StatusCode::UNAVAILABLE);  // trusts another CA
  // The admin port is TLS too; the health port stays plaintext for probes.
  EXPECT_TRUE(Call(server_->admin_port(), {.tls = Tls(TlsMode::kTls, "a", "a")}, true).ok());
  EXPECT_EQ(Call(server_->admin_port(), {}, true).error_code(), grpc::StatusCode::UNAVAILABLE);
  GrpcHealthProbe plaintext;
  EXPECT_TRUE(
      plaintext.Check(absl::StrCat("127.0.0.1:", server_->health_port()), absl::Seconds(3)).ok());
  GrpcHealthProbe with_tls({.tls = Tls(TlsMode::kTls, "a", "a")});
  EXPECT_TRUE(with_tls.Check(absl::StrCat("127.0.0.1:", server_->port()), absl::Seconds(3)).ok());
}

TEST_F(SecurityTest, ServerNameOverrideIsChecked) {
  Start(Tls(TlsMode::kTls, "a", "a"));
  TlsConfig named = Tls(TlsMode::kTls, "a", "a");
  named.server_name = "hlem.internal";  // in the certificate
  EXPECT_TRUE(Call({.tls = named}).ok());
  named.server_name = "other.example";  // not in it
  EXPECT_EQ(Call({.tls = named}).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, MutualTlsRequiresAClientCertificateFromTheCa) {
  Start(Tls(TlsMode::kMutual, "a", "a"));
  EXPECT_TRUE(Call({.tls = Tls(TlsMode::kMutual, "a", "a")}).ok());
  EXPECT_EQ(Call({.tls = Tls(TlsMode::kTls, "a", "a")}).error_code(),
            grpc::StatusCode::UNAVAILABLE);  // no client certificate
  EXPECT_EQ(Call({.tls = Tls(TlsMode::kMutual, "b", "a")}).error_code(),
            grpc::StatusCode::UNAVAILABLE);  // a client certificate of another CA
  EXPECT_EQ(Call({}).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, RotatedCertificatesAreServedWithoutARestart) {
  const std::string dir = ::testing::TempDir() + "/tls-rotate-" + std::to_string(::getpid());
  fs::create_directories(dir);
  for (const char* f : {"tls.crt", "tls.key", "ca.crt"}) {
    fs::copy_file(Pki("a", f), dir + "/" + f, fs::copy_options::overwrite_existing);
  }
  TlsConfig served{.mode = TlsMode::kTls,
                   .cert_file = dir + "/tls.crt",
                   .key_file = dir + "/tls.key",
                   .ca_file = dir + "/ca.crt",
                   .refresh = absl::Seconds(1)};
  Start(served);
  const ChannelOptions trusts_b{.tls = Tls(TlsMode::kTls, "b", "b")};
  EXPECT_TRUE(Call({.tls = Tls(TlsMode::kTls, "a", "a")}).ok());
  EXPECT_FALSE(Call(trusts_b).ok());

  auto read = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  WriteFile(dir + "/tls.key", read(Pki("b", "tls.key")));
  WriteFile(dir + "/tls.crt", read(Pki("b", "tls.crt")));
  bool rotated = false;
  for (const absl::Time until = absl::Now() + absl::Seconds(10); !rotated && absl::Now() < until;) {
    rotated = Call(trusts_b).ok();
    if (!rotated) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(rotated) << "the server still presents the old certificate after 10 s";
  EXPECT_FALSE(Call({.tls = Tls(TlsMode::kTls, "a", "a")}).ok());
  fs::remove_all(dir);
}

TEST_F(SecurityTest, AdminTokenGuardsAdminAndAFrontendTokenCannotCallIt) {
  auto admin = TokenFile::Fixed("admin-secret");
  auto frontend = TokenFile::Fixed("frontend-secret");
  Start(TlsConfig{}, frontend, admin);
  const int admin_port = server_->admin_port();
  EXPECT_EQ(Call(admin_port, {}, true).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status refused = Call(admin_port, {.token = frontend}, true);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("EchoAdmin"));
  EXPECT_TRUE(Call(admin_port, {.token = admin}, true).ok());
  // The frontend service takes its own token only.
  EXPECT_EQ(Call({}).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call({.token = admin}).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Call({.token = frontend}).ok());
}

TEST_F(SecurityTest, TokenAndMutualTlsTogether) {
  auto admin = TokenFile::Fixed("admin-secret");
  Start(Tls(TlsMode::kMutual, "a", "a"), nullptr, admin);
  EXPECT_TRUE(
      Call(server_->admin_port(), {.tls = Tls(TlsMode::kMutual, "a", "a"), .token = admin}, true)
          .ok());
  EXPECT_EQ(
      Call(server_->admin_port(), {.tls = Tls(TlsMode::kMutual, "a", "a")}, true).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
}

TEST(TokenFileTest, ReadsTrimsAndReloadsWhenTheFileChanges) {
  const std::string path = ::testing::TempDir() + "/token-" + std::to_string(::getpid());
  EXPECT_EQ(TokenFile::Open(path).status().code(), absl::StatusCode::kNotFound);
  WriteFile(path, "\n");
  EXPECT_EQ(TokenFile::Open(path).status().code(), absl::StatusCode::kInvalidArgument);
  WriteFile(path, "  first-token\n");
  auto token = TokenFile::Open(path, absl::ZeroDuration());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ((*token)->Get(), "first-token");
  WriteFile(path, "second-token\n");
  EXPECT_EQ((*token)->Get(), "second-token");
  WriteFile(path, "");  // emptied: the last good token stays
  EXPECT_EQ((*token)->Get(), "second-token");
  fs::remove(path);  // gone: the same
  EXPECT_EQ((*token)->Get(), "second-token");
}

// A call that comes while another re-reads the rotated file waits for that read (up to 1 s)
// instead of answering with the token the file no longer holds. The read is held up by a FIFO in
// the file's place: it blocks until the test writes the new token into it.
TEST(TokenFileTest, ACallDuringAReReadGetsTheNewToken) {
  const std::string dir = ::testing::TempDir() + "/token-fifo-" + std::to_string(::getpid());
  fs::create_directories(dir);
  const std::string path = dir + "/token", fifo = dir + "/fifo";
  WriteFile(path, "old-token\n");
  auto token = TokenFile::Open(path, absl::Milliseconds(300));
  ASSERT_TRUE(token.ok()) << token.status();
  ASSERT_EQ((*token)->Get(), "old-token");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::rename(fifo, path);
  absl::SleepFor(absl::Milliseconds(350));  // past the recheck: the next call re-reads
  std::string first, second;
  std::thread reader([&] { first = (*token)->Get(); });
  // The reader has the FIFO open once a writer can open it without blocking.
  int fd = -1;
  for (const absl::Time until = absl::Now() + absl::Seconds(10); fd < 0 && absl::Now() < until;) {
    fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd < 0) absl::SleepFor(absl::Milliseconds(5));
  }
  if (fd < 0) {
    ADD_FAILURE() << "the reader never opened the token file";
    WriteFile(path, "new-token\n");  // whatever the reader does, it ends
    reader.join();
    fs::remove_all(dir);
    return;
  }
  absl::Duration waited;
  std::thread waiter([&] {
    const absl::Time start = absl::Now();
    second = (*token)->Get();
    waited = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(200));  // the waiter arrives while the read is held
  const std::string content = "new-token\n";
  EXPECT_EQ(::write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
  ::close(fd);
  reader.join();
  // A regular file again: a waiter that came late and re-reads finds no FIFO to block on.
  WriteFile(path, "new-token\n");
  waiter.join();
  EXPECT_EQ(first, "new-token");
  EXPECT_EQ(second, "new-token");  // not the old one, which the file no longer holds
  EXPECT_GE(waited, absl::Milliseconds(20)) << "the waiter came after the read: nothing tested";
  fs::remove_all(dir);
}

TEST(ListenAddressTest, LoopbackTellsHostOnlyAddressesFromReachableOnes) {
  for (const char* a :
       {"", "127.0.0.1:0", "127.0.0.2:7000", "[::1]:50052", "localhost:1", "unix:/tmp/x.sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a :
       {"0.0.0.0:50052", "[::]:50052", "10.0.0.3:1", "node-0:50052", "1127.0.0.1:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

}  // namespace
}  // namespace hlem
