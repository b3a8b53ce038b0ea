#include "common/grpc_server.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_health_probe.h"
#include "common/grpc_status.h"
#include "common/request_limits.h"
#include "echo.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "hlem/v1/embedding_shard.pb.h"
#include "hlem/v1/router.pb.h"
#include "hlem/v1/serving_node.pb.h"

namespace hlem {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;
using ::testing::Not;

// Sleeps as asked (watching for cancellation) and reports what it saw.
template <typename Base>
class EchoImpl final : public Base {
 public:
  explicit EchoImpl(std::string prefix) : prefix_(std::move(prefix)) {}
  grpc::Status Echo(grpc::ServerContext* context, const test::EchoRequest* request,
                    test::EchoResponse* response) override {
    started_.fetch_add(1);
    absl::Time until = absl::Now() + absl::Milliseconds(request->sleep_ms());
    while (absl::Now() < until) {
      if (context->IsCancelled()) {
        cancelled_.fetch_add(1);
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while sleeping");
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    response->set_message(prefix_ + request->message());
    response->set_payload(std::string(request->reply_bytes(), 'x'));
    absl::Time deadline = DeadlineOf(*context);
    response->set_deadline_unix_ms(
        deadline == absl::InfiniteFuture() ? -1 : absl::ToUnixMillis(deadline));
    return grpc::Status::OK;
  }
  int started() const { return started_.load(); }
  int cancelled() const { return cancelled_.load(); }

 private:
  std::string prefix_;
  std::atomic<int> started_{0};
  std::atomic<int> cancelled_{0};
};
using EchoService = EchoImpl<test::Echo::Service>;
using AdminService = EchoImpl<test::EchoAdmin::Service>;

std::string Local(int port) { return absl::StrCat("127.0.0.1:", port); }

// Health status of `service` at `port`, or the RPC's error code as a negative number.
int Health(int port, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel(Local(port)));
  grpc::ClientContext context;
  SetDeadline(context, absl::Now() + absl::Seconds(2));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  return status.ok() ? response.status() : -status.error_code();
}
constexpr int kServing = HealthCheckResponse::SERVING;
constexpr int kNotServing = HealthCheckResponse::NOT_SERVING;

template <typename Service>
grpc::Status CallEcho(int port, const test::EchoRequest& request, test::EchoResponse* response,
                      absl::Duration timeout = absl::Seconds(10), int max_bytes = 64 << 20) {
  auto stub = Service::NewStub(MakeChannel(Local(port), max_bytes));
  grpc::ClientContext context;
  SetDeadline(context, absl::Now() + timeout);
  return stub->Echo(&context, request, response);
}

test::EchoRequest Request(const std::string& message, int sleep_ms = 0, int reply_bytes = 0) {
  test::EchoRequest r;
  r.set_message(message);
  r.set_sleep_ms(sleep_ms);
  r.set_reply_bytes(reply_bytes);
  return r;
}

// Raw bytes of the reflection service's answer to list_services, or "" on error. Uses the generic
// stub because Debian ships no reflection client stubs.
std::string ListServicesViaReflection(int port, grpc::StatusCode* code) {
  grpc::GenericStub stub(MakeChannel(Local(port)));
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  SetDeadline(context, absl::Now() + absl::Seconds(5));
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  call->StartCall(nullptr);
  cq.Next(&tag, &ok);
  grpc::Slice slice(std::string("\x3a\x01*", 3));  // field 7 (list_services) = "*"
  call->Write(grpc::ByteBuffer(&slice, 1), nullptr);
  cq.Next(&tag, &ok);
  call->WritesDone(nullptr);
  cq.Next(&tag, &ok);
  grpc::ByteBuffer reply;
  call->Read(&reply, nullptr);
  cq.Next(&tag, &ok);
  bool got_reply = ok;
  grpc::Status status;
  call->Finish(&status, nullptr);
  cq.Next(&tag, &ok);
  *code = status.error_code();
  std::string bytes;
  std::vector<grpc::Slice> slices;
  if (got_reply && reply.Dump(&slices).ok()) {
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

class GrpcServerTest : public ::testing::Test {
 protected:
  void Start(GrpcServerOptions options = {}) {
    options.admin_listen = "127.0.0.1:0";
    auto server = GrpcServer::Create(options, {&echo_}, {&admin_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    ASSERT_GT(server_->admin_port(), 0);
    ASSERT_NE(server_->port(), server_->admin_port());
  }
  EchoService echo_{"public:"};
  AdminService admin_{"admin:"};
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(GrpcServerTest, HealthIsServingOnBothPortsPerService) {
  Start();
  EXPECT_EQ(Health(server_->port(), ""), kServing);
  EXPECT_EQ(Health(server_->port(), "hlem.test.Echo"), kServing);
  EXPECT_EQ(Health(server_->port(), "hlem.test.EchoAdmin"), -grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Health(server_->admin_port(), ""), kServing);
  EXPECT_EQ(Health(server_->admin_port(), "hlem.test.EchoAdmin"), kServing);
}

TEST_F(GrpcServerTest, AdminServicesOnlyOnTheAdminPort) {
  Start();
  test::EchoResponse response;
  grpc::Status st = CallEcho<test::EchoAdmin>(server_->port(), Request("hi"), &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  st = CallEcho<test::EchoAdmin>(server_->admin_port(), Request("hi"), &response);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(response.message(), "admin:hi");
  st = CallEcho<test::Echo>(server_->admin_port(), Request("hi"), &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  st = CallEcho<test::Echo>(server_->port(), Request("hi"), &response);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(response.message(), "public:hi");
}

TEST_F(GrpcServerTest, ReflectionListsOnlyThePortsOwnServices) {
  Start();
  grpc::StatusCode code;
  std::string listed = ListServicesViaReflection(server_->port(), &code);
  EXPECT_EQ(code, grpc::StatusCode::OK);
  EXPECT_THAT(listed, HasSubstr("hlem.test.Echo"));
  EXPECT_THAT(listed, Not(HasSubstr("EchoAdmin")));
  listed = ListServicesViaReflection(server_->admin_port(), &code);
  EXPECT_THAT(listed, HasSubstr("hlem.test.EchoAdmin"));
}

TEST_F(GrpcServerTest, ReflectionCanBeTurnedOff) {
  Start({.reflection = false});
  grpc::StatusCode code;
  EXPECT_EQ(ListServicesViaReflection(server_->port(), &code), "");
  EXPECT_EQ(code, grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(GrpcServerTest, SetServingTogglesHealth) {
  Start();
  server_->SetServing(false);
  EXPECT_EQ(Health(server_->port(), ""), kNotServing);
  EXPECT_EQ(Health(server_->port(), "hlem.test.Echo"), kNotServing);
  EXPECT_EQ(Health(server_->admin_port(), "hlem.test.EchoAdmin"), kNotServing);
  server_->SetServing(true);
  EXPECT_EQ(Health(server_->port(), "hlem.test.Echo"), kServing);
}

TEST_F(GrpcServerTest, HealthProbeFollowsTheServingStatus) {
  Start();
  GrpcHealthProbe probe;
  EXPECT_TRUE(probe.Check(Local(server_->port()), absl::Seconds(2)).ok());
  server_->SetServing(false);
  const absl::Status down = probe.Check(Local(server_->port()), absl::Seconds(2));
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(down.message()), HasSubstr("NOT_SERVING"));
  server_->SetServing(true);
  EXPECT_TRUE(probe.Check(Local(server_->port()), absl::Seconds(2)).ok());
  server_->Shutdown();
  EXPECT_EQ(probe.Check(Local(server_->port()), absl::Milliseconds(300)).code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(GrpcServerTest, ShutdownDrainsAnInFlightRpc) {
  Start();
  test::EchoResponse response;
  grpc::Status status;
  std::thread client(
      [&] { status = CallEcho<test::Echo>(server_->port(), Request("slow", 500), &response); });
  while (echo_.started() == 0) absl::SleepFor(absl::Milliseconds(5));
  absl::Time start = absl::Now();
  server_->Shutdown();
  absl::Duration took = absl::Now() - start;
  client.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.message(), "public:slow");
  EXPECT_EQ(echo_.cancelled(), 0);
  EXPECT_GT(took, absl::Milliseconds(300));  // it waited for the RPC
  EXPECT_LT(took, absl::Seconds(5));
  int health = Health(server_->port(), "");
  EXPECT_NE(health, kServing);
  EXPECT_TRUE(health == kNotServing || health == -grpc::StatusCode::UNAVAILABLE) << health;
  server_->Wait();      // returns: already shut down
  server_->Shutdown();  // idempotent
}

TEST_F(GrpcServerTest, ShutdownCancelsRpcsPastTheDrainTimeout) {
  Start({.drain_timeout = absl::Milliseconds(200)});
  test::EchoResponse response;
  grpc::Status status;
  std::thread client(
      [&] { status = CallEcho<test::Echo>(server_->port(), Request("stuck", 20000), &response); });
  while (echo_.started() == 0) absl::SleepFor(absl::Milliseconds(5));
  absl::Time start = absl::Now();
  server_->Shutdown();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  client.join();
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(echo_.cancelled(), 1);
}

TEST_F(GrpcServerTest, WaitReturnsAfterShutdownFromAnotherThread) {
  Start();
  absl::Notification waited;
  std::thread waiter([&] {
    server_->Wait();
    waited.Notify();
  });
  EXPECT_FALSE(waited.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  server_->Shutdown();
  EXPECT_TRUE(waited.WaitForNotificationWithTimeout(absl::Seconds(5)));
  waiter.join();
}

TEST_F(GrpcServerTest, MessagesAboveTheDefaultFourMiBPass) {
  Start();
  test::EchoResponse response;
  grpc::Status st = CallEcho<test::Echo>(server_->port(),
                                         Request(std::string(6 << 20, 'a'), 0, 8 << 20), &response);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(response.payload().size(), 8u << 20);
  // A client with a 1 MiB limit refuses the same reply.
  st = CallEcho<test::Echo>(server_->port(), Request("a", 0, 2 << 20), &response, absl::Seconds(10),
                            1 << 20);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(GrpcServerTest, RequestsAboveTheReceiveLimitAreRefusedButRepliesMayBeLarger) {
  Start({.max_message_bytes = 16 << 20, .max_receive_bytes = 1 << 20});
  test::EchoResponse response;
  grpc::Status st =
      CallEcho<test::Echo>(server_->port(), Request(std::string(2 << 20, 'a')), &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  st = CallEcho<test::Echo>(server_->port(), Request("a", 0, 8 << 20), &response);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(response.payload().size(), 8u << 20);
}

// The largest event or candidate the wire allows: every id at the varint maximum.
template <typename Message>
void FillWorst(Message* m, int features) {
  m->set_item_id(~0ull);
  for (int f = 0; f < features; ++f) m->add_feature_ids(~0ull);
}

TEST(RequestLimitsTest, BoundTheLargestRequestsTheLimitsAdmit) {
  for (int features : {1, 3, 8}) {
    for (auto [events, candidates] : {std::pair{1, 1}, std::pair{20000, 100}, std::pair{5, 512}}) {
      v1::InferRequest infer;
      v1::RecommendRequest recommend;
      infer.set_user_id(~0ull);
      recommend.set_user_id(~0ull);
      for (int i = 0; i < events; ++i) {
        for (v1::Event* e : {infer.add_history(), recommend.add_history()}) {
          FillWorst(e, features);
          e->set_timestamp_unix_seconds(1.5e9);
        }
      }
      for (int i = 0; i < candidates; ++i) {
        FillWorst(infer.add_candidates(), features);
        FillWorst(recommend.add_candidates(), features);
      }
      for (v1::HistoryPrefix* p : {infer.mutable_delta(), recommend.mutable_delta()}) {
        p->set_length(~0u);
        p->set_hash(~0ull);
      }
      infer.set_expected_kv_resident(true);
      infer.set_request_id(std::string(256, 'r'));
      recommend.set_request_id(std::string(256, 'r'));
      const int limit = MaxScoringRequestBytes(events, candidates, features);
      EXPECT_LE(infer.ByteSizeLong(), static_cast<size_t>(limit)) << features << " " << events;
      EXPECT_LE(recommend.ByteSizeLong(), static_cast<size_t>(limit));
      // And not far above it, once the request is larger than the floor.
      if (infer.ByteSizeLong() > static_cast<size_t>(kMinReceiveBytes)) {
        EXPECT_LE(static_cast<size_t>(limit), 2 * infer.ByteSizeLong() + kRequestSlackBytes);
      }
    }
  }
  v1::LookupRequest lookup;
  lookup.set_table_id(~0u);
  for (int i = 0; i < 200000; ++i) lookup.add_row_ids(~0ull);
  EXPECT_LE(lookup.ByteSizeLong(), static_cast<size_t>(MaxLookupRequestBytes(200000)));
  EXPECT_GT(lookup.ByteSizeLong(), static_cast<size_t>(MaxLookupRequestBytes(100000)));
  // Huge limits clamp to what gRPC takes instead of overflowing.
  EXPECT_EQ(MaxScoringRequestBytes(~0ull, ~0ull, ~0ull), std::numeric_limits<int>::max());
  EXPECT_EQ(MaxLookupRequestBytes(~0ull), std::numeric_limits<int>::max());
  EXPECT_EQ(MaxScoringRequestBytes(0, 0, 0), kMinReceiveBytes);
}

TEST_F(GrpcServerTest, DeadlineReachesTheHandler) {
  Start();
  test::EchoResponse response;
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  auto stub = test::Echo::NewStub(MakeChannel(Local(server_->port())));
  grpc::ClientContext with;
  SetDeadline(with, deadline);
  ASSERT_TRUE(stub->Echo(&with, Request("d"), &response).ok());
  EXPECT_NEAR(static_cast<double>(response.deadline_unix_ms()),
              static_cast<double>(absl::ToUnixMillis(deadline)), 1000);
  grpc::ClientContext without;
  ASSERT_TRUE(stub->Echo(&without, Request("d"), &response).ok());
  EXPECT_EQ(response.deadline_unix_ms(), -1);
}

// The thread bound: beyond max_threads concurrent calls are refused at once with
// RESOURCE_EXHAUSTED (none hangs, none is lost); with the default bound all are served.
TEST_F(GrpcServerTest, CallsBeyondTheThreadBoundAreRefusedAtOnce) {
  for (const int max_threads : {3, 0}) {
    Start({.max_threads = max_threads});
    constexpr int kCalls = 16;
    std::vector<grpc::Status> status(kCalls);
    std::vector<absl::Duration> took(kCalls);
    std::vector<std::thread> clients;
    for (int i = 0; i < kCalls; ++i) {
      clients.emplace_back([&, i] {
        test::EchoResponse response;
        const absl::Time start = absl::Now();
        status[i] = CallEcho<test::Echo>(server_->port(), Request("x", 400), &response);
        took[i] = absl::Now() - start;
      });
    }
    for (std::thread& t : clients) t.join();
    int ok = 0, refused = 0;
    for (int i = 0; i < kCalls; ++i) {
      if (status[i].ok()) {
        ++ok;
        continue;
      }
      EXPECT_EQ(status[i].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << status[i].error_message();
      EXPECT_THAT(status[i].error_message(), HasSubstr("Threadpool Exhausted"));
      EXPECT_LT(took[i], absl::Milliseconds(350)) << "refused without waiting for a thread";
      ++refused;
    }
    if (max_threads > 0) {
      EXPECT_GT(refused, 0);
      EXPECT_GT(ok, 0);
      EXPECT_LT(ok, kCalls);
    } else {
      EXPECT_EQ(ok, kCalls);
    }
    server_->Shutdown();
    server_.reset();
  }
}

TEST(GrpcServerCreateTest, BusyPortIsUnavailable) {
  auto first = GrpcServer::Create(GrpcServerOptions{}, {});
  ASSERT_TRUE(first.ok()) << first.status();
  std::string address = Local((*first)->port());
  auto second = GrpcServer::Create({.listen = address}, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(address));

  auto busy_admin = GrpcServer::Create({.admin_listen = address}, {});
  ASSERT_FALSE(busy_admin.ok());
  EXPECT_THAT(std::string(busy_admin.status().message()), HasSubstr(address));
  EXPECT_EQ(Health((*first)->port(), ""), kServing);
}

TEST(GrpcServerCreateTest, NoAdminPortByDefault) {
  auto server = GrpcServer::Create(GrpcServerOptions{}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->admin_port(), 0);
  EXPECT_EQ((*server)->health_port(), 0);
}

TEST_F(GrpcServerTest, HealthPortReportsThePublicServicesAndServesNothingElse) {
  Start({.health_listen = "127.0.0.1:0"});
  const int port = server_->health_port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(Health(port, ""), kServing);
  EXPECT_EQ(Health(port, "hlem.test.Echo"), kServing);
  EXPECT_EQ(Health(port, kLivenessService), kServing);
  EXPECT_EQ(Health(port, "hlem.test.EchoAdmin"), -grpc::StatusCode::NOT_FOUND);
  test::EchoResponse response;
  EXPECT_EQ(CallEcho<test::Echo>(port, Request("hi"), &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  grpc::StatusCode code;
  EXPECT_EQ(ListServicesViaReflection(port, &code), "");  // no reflection there either
  server_->SetServing(false);
  EXPECT_EQ(Health(port, ""), kNotServing);
  EXPECT_EQ(Health(port, kLivenessService), kServing);
}

TEST_F(GrpcServerTest, WhileDrainingTheHealthPortIsNotReadyButAlive) {
  Start({.health_listen = "127.0.0.1:0"});
  const int port = server_->health_port();
  test::EchoResponse response;
  grpc::Status status;
  std::thread client(
      [&] { status = CallEcho<test::Echo>(server_->port(), Request("slow", 800), &response); });
  while (echo_.started() == 0) absl::SleepFor(absl::Milliseconds(5));
  std::thread stopper([&] { server_->Shutdown(); });
  absl::SleepFor(absl::Milliseconds(200));  // draining: the slow RPC holds the public port open
  EXPECT_EQ(Health(port, ""), kNotServing);
  EXPECT_EQ(Health(port, kLivenessService), kServing);
  stopper.join();
  client.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Health(port, kLivenessService), -grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace hlem
