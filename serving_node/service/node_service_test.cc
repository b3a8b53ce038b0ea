// The serving node's gRPC services in-process: a whole node stack (real HSTU, cpu device, fake
// embedding rows) behind a real gRPC server on loopback, called through the generated stubs.

#include "serving_node/service/node_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/rng.h"
#include "common/shed.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "serving_node/core/pipeline_testing.h"
#include "serving_node/service/node_stack.h"

namespace hlem::serving {
namespace {

namespace v1 = ::hlem::v1;
using ::hlem::serving::testing::FakeRowSource;
using ::hlem::serving::testing::kDim;
using ::testing::HasSubstr;

NodeConfig SmallConfig() {
  NodeConfig c;
  c.node.node_id = "test-node";
  c.pool_bytes = 64 * 4096;
  c.page_bytes = 4096;
  c.link = {.bytes_per_second = 1e10, .latency = absl::Microseconds(1)};
  c.shards.tables = {{.id = 0, .name = "item", .rows = 1000, .dim = kDim},
                     {.id = 1, .name = "category", .rows = 50, .dim = kDim}};
  c.features = {"item", "category"};
  c.model = {.layers = 1,
             .dim = kDim,
             .heads = 1,
             .d_qk = 8,
             .d_v = 8,
             .head_hidden = 8,
             .targets = 2,
             .attn_norm = 16,
             .max_positions = 256};
  c.max_history = 100;
  c.max_candidates = 16;
  c.max_request_events = 200;
  c.refill.chunk_bytes = 4096;
  return c;
}

class NodeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(SmallConfig()); }
  void Start(const NodeConfig& config) {
    SetComputeThreads(1);
    auto stack = NodeStack::Build(config, source_, 42, clock_);
    ASSERT_TRUE(stack.ok()) << stack.status();
    stack_ = std::move(*stack);
    stack_->Start();
    NodeDescription d{.model_name = "small", .model_layers = 1, .model_dim = kDim};
    d.tables = {{0, "item", 1000, kDim}, {1, "category", 50, kDim}};
    service_ = std::make_unique<ServingNodeServiceImpl>(*stack_->node, d);
    admin_ = std::make_unique<ServingNodeAdminImpl>(*stack_->node);
    auto server = GrpcServer::Create({.listen = "127.0.0.1:0", .admin_listen = "127.0.0.1:0"},
                                     {service_.get()}, {admin_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    service_->SetAdminPort(static_cast<uint32_t>(server_->admin_port()));
    stub_ = v1::ServingNode::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", server_->port())));
    admin_stub_ = v1::ServingNodeAdmin::NewStub(
        MakeChannel(absl::StrCat("127.0.0.1:", server_->admin_port())));
  }
  void TearDown() override {
    if (service_) service_->Stop();
    server_.reset();
  }

  static void AddEvents(Rng& rng, int n, v1::InferRequest* r) {
    for (int i = 0; i < n; ++i) {
      v1::Event* e = r->add_history();
      e->set_item_id(i);
      e->add_feature_ids(rng() % 1000);
      e->add_feature_ids(rng() % 50);
    }
  }
  static void AddCandidates(Rng& rng, int n, v1::InferRequest* r) {
    for (int i = 0; i < n; ++i) {
      v1::Candidate* c = r->add_candidates();
      c->add_feature_ids(rng() % 1000);
      c->add_feature_ids(rng() % 50);
    }
  }
  // On the fixture's server, or through `stub`.
  grpc::Status Infer(const v1::InferRequest& req, v1::InferResponse* resp,
                     absl::Duration timeout = absl::Seconds(30),
                     v1::ServingNode::Stub* stub = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return (stub != nullptr ? stub : stub_.get())->Infer(&ctx, req, resp);
  }

  RealClock clock_;
  FakeRowSource source_;
  std::unique_ptr<NodeStack> stack_;
  std::unique_ptr<ServingNodeServiceImpl> service_;
  std::unique_ptr<ServingNodeAdminImpl> admin_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::ServingNode::Stub> stub_;
  std::unique_ptr<v1::ServingNodeAdmin::Stub> admin_stub_;
};

void ExpectScoresNear(const v1::InferResponse& got, const v1::InferResponse& want) {
  ASSERT_EQ(got.scores_size(), want.scores_size());
  for (int i = 0; i < want.scores_size(); ++i) {
    EXPECT_NEAR(got.scores(i), want.scores(i), 1e-4 * std::max(1.0f, std::abs(want.scores(i))))
        << i;
  }
}

// memory.device: cuda builds the CUDA runner and pool; without a GPU (or without nvcc at build
// time) the node refuses to start and says why, naming the field. (On a GPU host, the same
// stack runs in cuda_node_test.)
TEST(NodeStackTest, TheCudaDeviceWithoutAGpuIsUnavailable) {
  NodeConfig config = SmallConfig();
  config.device = "cuda";
  testing::FakeRowSource source;
  RealClock clock;
  auto stack = NodeStack::Build(config, source, 1, clock);
  if (stack.ok()) GTEST_SKIP() << "a GPU is present: the cuda stack was built";
  EXPECT_EQ(stack.status().code(), absl::StatusCode::kUnavailable) << stack.status();
  EXPECT_NE(stack.status().message().find("memory.device: cuda"), std::string::npos)
      << stack.status();
}

// The refiller plans, fetches and is ticked on the background clock, never on the node's clock,
// whose timer thread completes the link's copies (LocalNodeOptions::background_clock).
TEST(NodeStackTest, RefillRunsOnTheBackgroundClock) {
  testing::FakeRowSource source;
  SimClock clock, background;
  auto stack = NodeStack::Build(SmallConfig(), source, 1, clock, &background);
  ASSERT_TRUE(stack.ok()) << stack.status();
  NodeStack& s = **stack;
  s.Start();
  ASSERT_TRUE(s.node->SetAlpha(0.9, 1, 1).ok());  // the EMB side grows: the node kicks refill
  clock.AdvanceBy(absl::Seconds(1));
  RefillStats r = s.refiller->GetStats();
  EXPECT_GE(r.kicks, 1u);
  EXPECT_FALSE(r.done);  // the plan waits for the background clock
  background.AdvanceBy(absl::Seconds(1));
  EXPECT_TRUE(s.refiller->GetStats().done);
}

TEST_F(NodeServiceTest, InferFullAndDeltaModeOverGrpc) {
  Rng rng(1);
  v1::InferRequest req;
  req.set_user_id(1);
  AddEvents(rng, 30, &req);
  AddCandidates(rng, 3, &req);
  v1::InferResponse first;
  ASSERT_TRUE(Infer(req, &first).ok());
  EXPECT_EQ(first.scores_size(), 6);  // 3 candidates × 2 tasks
  EXPECT_EQ(first.num_tasks(), 2u);
  EXPECT_EQ(first.cached_prefix_tokens(), 0u);
  EXPECT_EQ(first.computed_tokens(), 33u);
  EXPECT_EQ(first.next_prefix().length(), 30u);
  EXPECT_EQ(first.node_id(), "test-node");
  EXPECT_EQ(first.incarnation_epoch(), 42u);
  EXPECT_GT(first.timings().total_seconds(), 0.0);
  EXPECT_GT(first.emb_misses(), 0u);

  // Delta mode: only 5 new events go over the wire.
  v1::InferRequest delta;
  delta.set_user_id(1);
  *delta.mutable_delta() = first.next_prefix();
  AddEvents(rng, 5, &delta);
  *delta.mutable_candidates() = req.candidates();
  v1::InferResponse second;
  ASSERT_TRUE(Infer(delta, &second).ok());
  EXPECT_EQ(second.cached_prefix_tokens(), 30u);
  EXPECT_EQ(second.computed_tokens(), 8u);
  EXPECT_EQ(second.next_prefix().length(), 35u);

  // The same full history for a user the node never saw scores the same.
  v1::InferRequest full = req;
  full.set_user_id(2);
  full.mutable_history()->MergeFrom(delta.history());
  v1::InferResponse cold;
  ASSERT_TRUE(Infer(full, &cold).ok());
  EXPECT_EQ(cold.cached_prefix_tokens(), 0u);
  ExpectScoresNear(second, cold);
  EXPECT_EQ(cold.next_prefix().hash(), second.next_prefix().hash());

  // A stale prefix must be resent in full.
  v1::InferResponse resp;
  grpc::Status st = Infer(delta, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
}

// A request shed late (it waited in the node's queue longer than queue.max_delay) carries the
// trailing metadata that tells the router not to retry it elsewhere (common/shed.h); any other
// refusal does not. With max_delay 1 ns every queued request is late by the time a worker takes
// it, and a request the node refuses as invalid never queues.
class LateShedTest : public NodeServiceTest {
 protected:
  void SetUp() override {
    NodeConfig c = SmallConfig();
    c.queue.max_delay = absl::Nanoseconds(1);
    Start(c);
  }
};

TEST_F(LateShedTest, ALateShedCarriesTheTrailer) {
  Rng rng(7);
  v1::InferRequest req;
  req.set_user_id(3);
  AddEvents(rng, 4, &req);
  AddCandidates(rng, 2, &req);
  auto call = [&](const v1::InferRequest& r, std::string* shed) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::InferResponse resp;
    const grpc::Status st = stub_->Infer(&ctx, r, &resp);
    const auto& trailers = ctx.GetServerTrailingMetadata();
    const auto it = trailers.find(kShedMetadataKey);
    *shed = it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
    return st;
  };
  std::string shed;
  grpc::Status st = call(req, &shed);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("max_delay"), std::string::npos) << st.error_message();
  EXPECT_EQ(shed, kShedLateValue);

  v1::InferRequest invalid = req;
  invalid.clear_candidates();
  st = call(invalid, &shed);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(shed, "");
}

TEST_F(NodeServiceTest, BadInputGetsClearErrors) {
  Rng rng(2);
  v1::InferResponse resp;
  auto code_of = [&](const v1::InferRequest& r, std::string* message = nullptr) {
    grpc::Status st = Infer(r, &resp);
    if (message != nullptr) *message = st.error_message();
    return st.error_code();
  };
  v1::InferRequest none;
  none.set_user_id(1);
  AddEvents(rng, 3, &none);
  std::string message;
  EXPECT_EQ(code_of(none, &message), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(message.find("candidates"), std::string::npos) << message;

  v1::InferRequest ragged = none;
  AddCandidates(rng, 1, &ragged);
  ragged.mutable_history(1)->clear_feature_ids();
  EXPECT_EQ(code_of(ragged, &message), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(message.find("history[1].feature_ids: 0 ids"), std::string::npos) << message;

  v1::InferRequest range = none;
  AddCandidates(rng, 1, &range);
  range.mutable_candidates(0)->set_feature_ids(1, 50);  // category has 50 rows
  EXPECT_EQ(code_of(range, &message), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(message.find("candidates[0].feature_ids[1]"), std::string::npos) << message;

  v1::InferRequest too_many = none;
  AddCandidates(rng, 17, &too_many);
  EXPECT_EQ(code_of(too_many), grpc::StatusCode::INVALID_ARGUMENT);

  v1::InferRequest too_long;
  AddEvents(rng, 201, &too_long);
  AddCandidates(rng, 1, &too_long);
  EXPECT_EQ(code_of(too_long, &message), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(message.find("exceeds the limit 200"), std::string::npos) << message;

  v1::InferRequest unknown_prefix = none;
  AddCandidates(rng, 1, &unknown_prefix);
  unknown_prefix.mutable_delta()->set_length(10);
  unknown_prefix.mutable_delta()->set_hash(99);
  EXPECT_EQ(code_of(unknown_prefix), grpc::StatusCode::FAILED_PRECONDITION);

  // Every one of them was answered and counted; none was computed.
  ASSERT_TRUE(stack_->node->Drain(true, absl::Now() + absl::Seconds(5)).drained);
  const NodeWindow w = stack_->node->CloseWindow();
  // The ragged one and the two over the limits were refused while decoding (before their ids
  // were copied): they never reached the node.
  EXPECT_EQ(w.requests, 3u);
  EXPECT_EQ(w.slo_violation_fraction, 0.0);
  v1::InferRequest ok = none;
  AddCandidates(rng, 1, &ok);
  EXPECT_EQ(code_of(ok), grpc::StatusCode::UNAVAILABLE);  // drained
}

TEST_F(NodeServiceTest, StateInfoAlphaStreamAndSnapshot) {
  Rng rng(3);
  for (uint64_t user = 1; user <= 3; ++user) {
    v1::InferRequest req;
    req.set_user_id(user);
    AddEvents(rng, 10, &req);
    AddCandidates(rng, 2, &req);
    v1::InferResponse resp;
    ASSERT_TRUE(Infer(req, &resp).ok());
  }
  stack_->node->CloseWindow();
  {
    grpc::ClientContext ctx;
    v1::GetStateRequest req;
    req.set_max_windows(5);
    v1::GetStateResponse resp;
    ASSERT_TRUE(stub_->GetState(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.windows_size(), 1);
    EXPECT_EQ(resp.windows(0).requests(), 3u);
    EXPECT_EQ(resp.windows(0).hot_user_ratio(), 0.0);
    EXPECT_DOUBLE_EQ(resp.windows(0).alpha_effective(), 0.5);
    EXPECT_EQ(resp.current().kv_resident_users(), 3u);
    EXPECT_EQ(resp.current().pool_bytes(), 64u * 4096);
  }
  {
    grpc::ClientContext ctx;
    v1::NodeInfo info;
    ASSERT_TRUE(stub_->GetNodeInfo(&ctx, v1::GetNodeInfoRequest(), &info).ok());
    EXPECT_EQ(info.feature_tables_size(), 2);
    EXPECT_EQ(info.feature_tables(1).rows(), 50u);
    EXPECT_EQ(info.admin_port(), static_cast<uint32_t>(server_->admin_port()));
    EXPECT_EQ(info.max_history_tokens(), 100u);
    EXPECT_EQ(info.num_tasks(), 2u);
  }
  {
    auto set = [&](double alpha, uint64_t epoch, uint64_t id) {
      grpc::ClientContext ctx;
      v1::SetAlphaRequest req;
      req.set_alpha(alpha);
      req.set_allocator_epoch(epoch);
      req.set_decision_id(id);
      v1::SetAlphaResponse resp;
      return stub_ == nullptr ? grpc::Status::CANCELLED : admin_stub_->SetAlpha(&ctx, req, &resp);
    };
    EXPECT_EQ(set(-0.1, 1, 1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(set(0.3, 0, 1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(set(0.3, 1, 2).ok());
    EXPECT_EQ(set(0.6, 1, 1).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_DOUBLE_EQ(stack_->node->Gauges().alpha_target, 0.3);
  }
  {
    // The stream replays from seq 1: three users stored, and load reports.
    grpc::ClientContext ctx;
    v1::StreamResidencyRequest req;
    req.set_from_seq(1);
    auto reader = stub_->StreamResidency(&ctx, req);
    v1::StreamResidencyResponse msg;
    ASSERT_TRUE(reader->Read(&msg));
    EXPECT_EQ(msg.epoch(), 42u);
    int stored = 0;
    for (int i = 0; i < msg.events_size(); ++i) {
      EXPECT_EQ(msg.events(i).seq(), static_cast<uint64_t>(i + 1));
      if (msg.events(i).has_kv_stored()) ++stored;
    }
    EXPECT_EQ(stored, 3);
    ctx.TryCancel();
    while (reader->Read(&msg)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  {
    grpc::ClientContext ctx;
    v1::StreamResidencyRequest req;
    req.set_epoch(41);
    auto reader = stub_->StreamResidency(&ctx, req);
    v1::StreamResidencyResponse msg;
    EXPECT_FALSE(reader->Read(&msg));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext ctx;
    v1::StreamResidencyRequest req;
    req.set_from_seq(stack_->events->last_seq() + 5);
    auto reader = stub_->StreamResidency(&ctx, req);
    v1::StreamResidencyResponse msg;
    EXPECT_FALSE(reader->Read(&msg));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::OUT_OF_RANGE);
  }
  {
    grpc::ClientContext ctx;
    auto reader = admin_stub_->Snapshot(&ctx, v1::SnapshotRequest());
    v1::SnapshotChunk chunk;
    std::vector<uint64_t> users;
    uint64_t seq = 0;
    while (reader->Read(&chunk)) {
      seq = chunk.seq();
      for (const v1::ResidentUser& u : chunk.users()) {
        users.push_back(u.user_id());
        EXPECT_EQ(u.cached_tokens(), 10u);
      }
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(users, (std::vector<uint64_t>{1, 2, 3}));
    EXPECT_GT(seq, 0u);
  }
}

TEST_F(NodeServiceTest, ResidencyStreamsBeyondTheLimitAreRefusedAtOnce) {
  // A service with room for two streams on a server of its own.
  NodeDescription d{.model_name = "small", .model_layers = 1, .model_dim = kDim};
  ServingNodeServiceImpl capped(*stack_->node, d, /*max_streams=*/2);
  auto server = GrpcServer::Create({.listen = "127.0.0.1:0"}, {&capped});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::ServingNode::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", (*server)->port())));
  struct Open {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::StreamResidencyResponse>> reader;
  };
  auto open = [&](Open* o) {
    v1::StreamResidencyRequest req;
    o->reader = stub->StreamResidency(&o->ctx, req);
    v1::StreamResidencyResponse msg;
    return o->reader->Read(&msg);  // the first message comes at once on an accepted stream
  };
  Open a, b, c;
  ASSERT_TRUE(open(&a));
  ASSERT_TRUE(open(&b));
  EXPECT_FALSE(open(&c));
  const grpc::Status refused = c.reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("residency streams"));
  // Infer still has threads, and a closed stream frees its place.
  Rng rng(3);
  v1::InferRequest req;
  req.set_user_id(9);
  AddEvents(rng, 5, &req);
  AddCandidates(rng, 2, &req);
  v1::InferResponse resp;
  EXPECT_TRUE(Infer(req, &resp, absl::Seconds(30), stub.get()).ok());
  a.ctx.TryCancel();
  v1::StreamResidencyResponse msg;
  while (a.reader->Read(&msg)) {
  }
  a.reader->Finish();
  bool reopened = false;
  for (int i = 0; i < 200 && !reopened; ++i) {  // the handler returns once it sees the cancel
    Open again;
    reopened = open(&again);
    if (reopened) again.ctx.TryCancel();
    while (again.reader->Read(&msg)) {
    }
    again.reader->Finish();
    if (!reopened) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(reopened);
  b.ctx.TryCancel();
  while (b.reader->Read(&msg)) {
  }
  b.reader->Finish();
  capped.Stop();
}

// Every ServingNodeAdmin method, listed from the service's descriptor (a method added later is
// covered too), refuses a call without the admin token and one with another token.
TEST_F(NodeServiceTest, EveryAdminMethodNeedsTheAdminToken) {
  auto token = TokenFile::Fixed("admin-secret");
  ServingNodeAdminImpl guarded(*stack_->node, token.get());
  auto server = GrpcServer::Create({.listen = "127.0.0.1:0"}, {&guarded});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::ServingNodeAdmin::service_full_name());
  ASSERT_NE(service, nullptr);
  ASSERT_GE(service->method_count(), 3);
  for (const auto& [presented, want] :
       {std::pair{std::shared_ptr<TokenFile>(), grpc::StatusCode::UNAUTHENTICATED},
        std::pair{TokenFile::Fixed("frontend-secret"), grpc::StatusCode::PERMISSION_DENIED}}) {
    grpc::GenericStub stub(MakeChannel(address, ChannelOptions{.token = presented}));
    for (int m = 0; m < service->method_count(); ++m) {
      const std::string method =
          absl::StrCat("/", service->full_name(), "/", service->method(m)->name());
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      grpc::ByteBuffer request, response;  // an empty message: every field at its default
      grpc::Slice empty("");
      request = grpc::ByteBuffer(&empty, 1);
      absl::Notification done;
      grpc::Status status;
      stub.UnaryCall(&context, method, {}, &request, &response, [&](grpc::Status s) {
        status = std::move(s);
        done.Notify();
      });
      done.WaitForNotification();
      EXPECT_EQ(status.error_code(), want) << method << ": " << status.error_message();
    }
  }
  // The admin token passes.
  auto admin = v1::ServingNodeAdmin::NewStub(MakeChannel(address, ChannelOptions{.token = token}));
  grpc::ClientContext context;
  v1::SetAlphaRequest request;
  request.set_alpha(0.5);
  request.set_allocator_epoch(1);
  request.set_decision_id(1);
  v1::SetAlphaResponse response;
  EXPECT_TRUE(admin->SetAlpha(&context, request, &response).ok());
  (*server)->Shutdown();
}

}  // namespace
}  // namespace hlem::serving
