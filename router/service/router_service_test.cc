// The router's gRPC service in-process over a fake node (a gRPC server on loopback whose Infer
// waits until released): the door limits (--max-in-flight, --adaptive-in-flight) and the frontend
// token; over refusing nodes, which refusals the router retries elsewhere; and its residency
// feed's Cancel.
#include "router/service/router_service.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/shed.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/service/grpc_feed.h"

namespace hlem::router {
namespace {

namespace v1 = ::hlem::v1;
using ::testing::HasSubstr;

// Holds every Infer until Release(); counts the calls and the most at once.
class HeldNode final : public v1::ServingNode::Service {
 public:
  grpc::Status Infer(grpc::ServerContext*, const v1::InferRequest* request,
                     v1::InferResponse* response) override {
    const int now = in_flight_.fetch_add(1) + 1;
    int seen = most_.load();
    while (now > seen && !most_.compare_exchange_weak(seen, now)) {
    }
    calls_.fetch_add(1);
    release_.WaitForNotificationWithTimeout(absl::Seconds(20));
    for (int c = 0; c < request->candidates_size(); ++c) response->add_scores(0.5f);
    response->set_num_tasks(1);
    in_flight_.fetch_sub(1);
    return grpc::Status::OK;
  }
  void Release() {
    std::call_once(released_, [this] { release_.Notify(); });
  }
  int calls() const { return calls_.load(); }
  int most() const { return most_.load(); }

 private:
  absl::Notification release_;
  std::once_flag released_;
  std::atomic<int> in_flight_{0}, most_{0}, calls_{0};
};

v1::RecommendRequest Request(uint64_t user) {
  v1::RecommendRequest r;
  r.set_user_id(user);
  for (int i = 0; i < 4; ++i) r.add_history()->set_item_id(i + 1);
  r.add_candidates()->set_item_id(9);
  return r;
}

class RouterServiceTest : public ::testing::Test {
 protected:
  // `rows`: of the one feature table (valid ids [0, rows)).
  void Start(RouterServiceOptions options, uint64_t rows = 1 << 20) {
    auto node_server = GrpcServer::Create({.listen = "127.0.0.1:0"}, {&node_});
    ASSERT_TRUE(node_server.ok()) << node_server.status();
    node_server_ = std::move(*node_server);
    ClusterOptions c;
    c.features = {{.table_id = 0, .residency_shard_rows = 64, .rows = rows}};
    auto cluster = Cluster::Create(c, clock_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    const int index = *cluster_->AddNode("node-0", "node-0");
    serving::ResidencySnapshot snapshot;
    snapshot.epoch = 1;
    cluster_->Reset(index, snapshot);
    service_ = std::make_unique<RouterServiceImpl>(options, *cluster_);
    service_->SetNodeStub(
        index,
        v1::ServingNode::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", node_server_->port()))));
  }
  void TearDown() override {
    node_.Release();
    if (node_server_) node_server_->Shutdown();
  }
  grpc::Status Call(uint64_t user, v1::RecommendResponse* response) {
    grpc::ServerContext context;
    const v1::RecommendRequest request = Request(user);
    return service_->Recommend(&context, &request, response);
  }
  // Sends `n` calls (users 1 .. n) on threads of their own and waits until the held node has
  // them; their answers go to `held` once the node is released and the threads joined.
  std::vector<std::thread> HoldCalls(int n, std::vector<grpc::Status>* held) {
    held->assign(static_cast<size_t>(n), grpc::Status());
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([this, held, i] {
        v1::RecommendResponse response;
        (*held)[static_cast<size_t>(i)] = Call(static_cast<uint64_t>(i + 1), &response);
      });
    }
    for (const absl::Time until = absl::Now() + absl::Seconds(10);
         node_.calls() < n && absl::Now() < until;) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return threads;
  }

  RealClock clock_;
  HeldNode node_;
  std::unique_ptr<GrpcServer> node_server_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<RouterServiceImpl> service_;
};

// With --max-in-flight 2, two calls reach the node and the others are refused at once with
// RESOURCE_EXHAUSTED (not queued); once the two finish, the door opens again.
TEST_F(RouterServiceTest, MaxInFlightShedsAtTheDoor) {
  Start({.max_in_flight = 2});
  std::vector<grpc::Status> held;
  std::vector<std::thread> threads = HoldCalls(2, &held);
  ASSERT_EQ(node_.calls(), 2);
  for (int i = 0; i < 4; ++i) {
    v1::RecommendResponse response;
    const absl::Time t0 = absl::Now();
    const grpc::Status refused = Call(static_cast<uint64_t>(10 + i), &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(refused.error_message(), HasSubstr("limit of 2"));
    EXPECT_LT(absl::Now() - t0, absl::Seconds(1)) << "refused at once, not queued";
  }
  EXPECT_EQ(node_.calls(), 2);  // none of the refused reached the node
  node_.Release();
  for (std::thread& t : threads) t.join();
  for (const grpc::Status& s : held) EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(node_.most(), 2);
  v1::RecommendResponse response;
  EXPECT_TRUE(Call(99, &response).ok());  // the count came back down
  EXPECT_EQ(node_.calls(), 3);
}

// The adaptive limit (--adaptive-in-flight) at the door: until it has measured the unloaded
// latency it lets initial_limit calls through and refuses the rest at once; the OK answers are
// its samples (an invalid request's answer is not: with it, three held answers would complete
// the four).
TEST_F(RouterServiceTest, TheAdaptiveLimitShedsAtTheDoorAndLearnsFromTheAnswers) {
  ConcurrencyLimit limit({.min_limit = 3,
                          .max_limit = 8,
                          .initial_limit = 3,
                          .min_samples = 100,  // no update during the test
                          .rebaseline_every = absl::Hours(1),
                          .first_baseline_within = absl::Hours(1),
                          .baseline_samples = 4},
                         clock_);
  Start({.concurrency_limit = &limit});
  {
    grpc::ServerContext context;
    v1::RecommendRequest bad = Request(5);
    bad.clear_candidates();
    v1::RecommendResponse response;
    EXPECT_EQ(service_->Recommend(&context, &bad, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  std::vector<grpc::Status> held;
  std::vector<std::thread> threads = HoldCalls(3, &held);
  ASSERT_EQ(node_.calls(), 3);
  v1::RecommendResponse response;
  const grpc::Status refused = Call(10, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("adaptive limit of 3"));
  EXPECT_THAT(refused.error_message(), HasSubstr("not measured yet"));
  EXPECT_EQ(node_.calls(), 3);
  absl::SleepFor(absl::Milliseconds(20));
  node_.Release();
  for (std::thread& t : threads) t.join();
  for (const grpc::Status& s : held) EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(limit.Stats().baselines, 0u);  // three samples of four: the invalid one is none
  EXPECT_TRUE(Call(11, &response).ok());
  const ConcurrencyLimitStats s = limit.Stats();
  EXPECT_EQ(s.baselines, 1u);
  EXPECT_GE(s.baseline, absl::Milliseconds(20));  // the held calls' latency
  EXPECT_EQ(s.limit, 3u);
  EXPECT_EQ(s.in_flight, 0u);
  EXPECT_EQ(s.refused, 1u);
}

TEST_F(RouterServiceTest, NoLimitByDefault) {
  Start({});
  node_.Release();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      v1::RecommendResponse response;
      ok += Call(static_cast<uint64_t>(i + 1), &response).ok();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
}

// An id beyond its table is refused at the router with the node's code (OUT_OF_RANGE), before the
// request reaches a node or replaces the user's shard profile; so is a wrong count of ids
// (INVALID_ARGUMENT, checked first as the node does).
TEST_F(RouterServiceTest, IdsBeyondTheirTableAreRefusedBeforeTheProfileAndTheNode) {
  Start({}, /*rows=*/16);
  node_.Release();
  auto call = [&](const v1::RecommendRequest& request) {
    grpc::ServerContext context;
    v1::RecommendResponse response;
    return service_->Recommend(&context, &request, &response);
  };
  v1::RecommendRequest history = Request(1);
  history.add_history()->set_item_id(16);
  grpc::Status st = call(history);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(st.error_message(), HasSubstr("history[4].feature_ids[0]: id 16 >= table 0's 16"));
  v1::RecommendRequest candidate = Request(1);
  candidate.add_candidates()->add_feature_ids(1u << 30);
  st = call(candidate);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(st.error_message(), HasSubstr("candidates[1].feature_ids[0]: id 1073741824"));
  v1::RecommendRequest two_ids = Request(1);
  two_ids.mutable_history(0)->add_feature_ids(1);
  two_ids.mutable_history(0)->add_feature_ids(2);
  st = call(two_ids);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("history[0].feature_ids: 2 ids"));
  two_ids.add_history()->set_item_id(16);  // both faults: the count is reported, as by the node
  EXPECT_EQ(call(two_ids).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(node_.calls(), 0);
  EXPECT_EQ(cluster_->Stats().cached_profiles, 0u);

  // The last id in range passes.
  v1::RecommendRequest last = Request(1);
  last.add_history()->set_item_id(15);
  EXPECT_TRUE(call(last).ok());
  EXPECT_EQ(node_.calls(), 1);
  EXPECT_EQ(cluster_->Stats().cached_profiles, 1u);
}

// The frontend token is checked before anything else, over a real server.
TEST_F(RouterServiceTest, FrontendTokenIsRequired) {
  auto token = TokenFile::Fixed("frontend-secret");
  Start({.frontend_token = token.get()});
  node_.Release();
  auto server = GrpcServer::Create({.listen = "127.0.0.1:0"}, {service_.get()});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  auto call = [&](std::shared_ptr<TokenFile> presented) {
    auto stub = v1::Router::NewStub(MakeChannel(address, ChannelOptions{.token = presented}));
    grpc::ClientContext context;
    v1::RecommendResponse response;
    return stub->Recommend(&context, Request(5), &response).error_code();
  };
  EXPECT_EQ(call(nullptr), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(TokenFile::Fixed("admin-secret")), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(call(token), grpc::StatusCode::OK);
  EXPECT_EQ(node_.calls(), 1);  // the refused never reached the node
  (*server)->Shutdown();
}

// Refuses every Infer with RESOURCE_EXHAUSTED: at admission, or (late) marked the way the node
// service marks a request shed after waiting out its max_delay (common/shed.h).
class RefusingNode final : public v1::ServingNode::Service {
 public:
  explicit RefusingNode(bool late) : late_(late) {}
  grpc::Status Infer(grpc::ServerContext* context, const v1::InferRequest*,
                     v1::InferResponse*) override {
    calls_.fetch_add(1);
    if (late_) context->AddTrailingMetadata(kShedMetadataKey, kShedLateValue);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, late_ ? "waited" : "queue full");
  }
  int calls() const { return calls_.load(); }

 private:
  const bool late_;
  std::atomic<int> calls_{0};
};

// Two refusing nodes behind a RouterServiceImpl (called directly; the nodes over gRPC).
class RefusingCluster {
 public:
  RefusingCluster(bool late, RouterServiceOptions options)
      : nodes_{RefusingNode(late), RefusingNode(late)} {
    ClusterOptions c;
    c.features = {{.table_id = 0, .residency_shard_rows = 64}};
    auto cluster = Cluster::Create(c, clock_);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    service_ = std::make_unique<RouterServiceImpl>(options, *cluster_);
    for (int i = 0; i < 2; ++i) {
      auto server = GrpcServer::Create({.listen = "127.0.0.1:0"}, {&nodes_[i]});
      EXPECT_TRUE(server.ok()) << server.status();
      const int index = *cluster_->AddNode(absl::StrCat("node-", i), absl::StrCat("node-", i));
      serving::ResidencySnapshot snapshot;
      snapshot.epoch = 1;
      cluster_->Reset(index, snapshot);
      service_->SetNodeStub(index, v1::ServingNode::NewStub(
                                       MakeChannel(absl::StrCat("127.0.0.1:", (*server)->port()))));
      servers_.push_back(std::move(*server));
    }
  }
  ~RefusingCluster() {
    for (auto& server : servers_) server->Shutdown();
  }
  grpc::Status Call(uint64_t user) {
    grpc::ServerContext context;
    const v1::RecommendRequest request = Request(user);
    v1::RecommendResponse response;
    return service_->Recommend(&context, &request, &response);
  }
  int node_calls() const { return nodes_[0].calls() + nodes_[1].calls(); }
  RouterServiceImpl& service() { return *service_; }
  const Cluster& cluster() const { return *cluster_; }

 private:
  RealClock clock_;
  RefusingNode nodes_[2];
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<RouterServiceImpl> service_;
};

// A node that refuses at admission is retried on the other node (and the client gets the second
// refusal); a late shed is not: the client gets it after one node call.
TEST(RouterRetryTest, ALateShedIsNotRetriedElsewhere) {
  for (const bool late : {false, true}) {
    SCOPED_TRACE(late ? "late" : "at admission");
    RefusingCluster cluster(late, {});
    EXPECT_EQ(cluster.Call(7).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(cluster.node_calls(), late ? 1 : 2);
  }
}

// A dispatch the node refused (any error: bad input, shed, down) leaves no speculative KV
// belief behind, or the user's next request would count as a stale hit there.
TEST(RouterRetryTest, AFailedDispatchLeavesNoSpeculativeBelief) {
  RefusingCluster cluster(/*late=*/true, {});
  EXPECT_EQ(cluster.Call(7).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(cluster.node_calls(), 1);
  for (const NodeStatus& n : cluster.cluster().Nodes()) EXPECT_EQ(n.speculative_users, 0u) << n.id;
}

// The retry budget: with no ratio and a floor of one retry per 10 s window, the first refused
// request is retried and the next two are answered with their first refusal; once the window
// has passed (the budget's clock), a retry goes again.
TEST(RouterRetryTest, RetriesStayWithinTheBudget) {
  SimClock clock(absl::FromUnixSeconds(1'000'000));
  RefusingCluster cluster(
      false, {.retry_budget = {.ratio = 0, .min_per_second = 0.1, .window = absl::Seconds(10)},
              .clock = &clock});
  for (uint64_t user = 1; user <= 3; ++user) {
    const grpc::Status st = cluster.Call(user);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(st.error_message(), "queue full");
  }
  EXPECT_EQ(cluster.node_calls(), 4);  // 2 + 1 + 1
  clock.AdvanceBy(absl::Seconds(11));
  EXPECT_EQ(cluster.Call(4).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(cluster.node_calls(), 6);
  const RetryBudgetStats s = cluster.service().retry_stats();
  EXPECT_EQ(s.requests, 4u);
  EXPECT_EQ(s.retries, 2u);
  EXPECT_EQ(s.over_budget, 2u);
}

// A node whose admin Snapshot never sends a chunk (a stalled node): it waits until the router
// cancels the call, or 20 s.
class StalledSnapshotNode final : public v1::ServingNodeAdmin::Service {
 public:
  grpc::Status Snapshot(grpc::ServerContext* context, const v1::SnapshotRequest*,
                        grpc::ServerWriter<v1::SnapshotChunk>*) override {
    started_.Notify();
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!context->IsCancelled() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stalled");
  }
  absl::Notification started_;
};

// Cancel ends a snapshot in progress: a node dropped while its snapshot streams (NodeLinks::Leave
// cancels the feed, then joins its thread on the membership poll's thread) used to hold the poll
// for the snapshot's 30 s deadline, as only streams could be cancelled.
TEST(GrpcResidencyFeedTest, CancelEndsASnapshotInProgress) {
  StalledSnapshotNode admin;
  auto server = GrpcServer::Create({.listen = "127.0.0.1:0"}, {&admin});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeChannel(absl::StrCat("127.0.0.1:", (*server)->port()));
  GrpcResidencyFeed feed(v1::ServingNode::NewStub(channel), v1::ServingNodeAdmin::NewStub(channel),
                         "test");
  absl::Status snapshot;
  std::thread call([&] { snapshot = feed.Snapshot().status(); });
  const bool started = admin.started_.WaitForNotificationWithTimeout(absl::Seconds(10));
  const absl::Time cancelled = absl::Now();
  feed.Cancel();
  call.join();
  ASSERT_TRUE(started);
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(2));
  EXPECT_EQ(snapshot.code(), absl::StatusCode::kCancelled) << snapshot;
  // And the feed refuses calls after Cancel.
  EXPECT_EQ(feed.Snapshot().status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace hlem::router
