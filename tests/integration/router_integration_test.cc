// The router binary in front of two serving_node binaries and one embedding shard, on loopback:
// a returning user is sent back to the node holding its K/V; the router's view follows the nodes'
// residency streams; bad input gets clear errors; a node that goes away loses its users to the
// other node without failed requests.

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"
#include "common/process.h"
#include "common/rng.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "hlem/v1/router.grpc.pb.h"
#include "tests/testing/node_process.h"
#include "tests/testing/shard_cluster.h"

namespace hlem {
namespace {

namespace v1 = ::hlem::v1;

constexpr char kNode[] = R"(
node: {slo: 2s, window: 500ms, load_report_interval: 100ms}
memory: {pool_bytes: 16MiB, page_bytes: 64KiB, initial_alpha: 0.5}
model: {seed: 23, layers: 1, dim: 32, heads: 2, d_qk: 16, d_v: 16, head_hidden: 32,
        max_positions: 512, features: [item, category], max_history: 300, max_candidates: 32}
shards: {config: shards.yaml, transport: grpc}
)";

class RouterIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/hlem_router_it_", getpid());
    auto cluster =
        testing::StartShardsForNodes(HLEM_SHARD_BINARY, dir_, testing::kTestShardsYaml, kNode);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    shards_ = std::move(*cluster);
    for (const char* name : {"node-a", "node-b"}) {
      auto node = testing::StartNode(HLEM_NODE_BINARY, dir_, dir_ + "/node.yaml", name,
                                     shards_->addresses());
      ASSERT_TRUE(node.ok()) << node.status();
      nodes_.push_back(std::move(*node));
    }
    // A third address in the router's list whose node starts later (it joins then).
    late_port_ = testing::UnusedPort();
    ASSERT_GT(late_port_, 0);
    late_address_ = absl::StrCat("127.0.0.1:", late_port_);
    const std::string ports = dir_ + "/router.ports";
    auto router = ChildProcess::Start(
        {HLEM_ROUTER_BINARY, "--nodes",
         absl::StrCat(nodes_[0].address(), ",", nodes_[1].address(), ",", late_address_),
         "--ports-file", ports, "--max-report-age-ms", "2000", "--discovery-interval-s", "0.2",
         "--unhealthy-to-leave", "2", "--calibrate-costs", "true"},
        dir_ + "/router.log");
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = std::make_unique<ChildProcess>(std::move(*router));
    auto port = WaitForPort(ports, "grpc", absl::Seconds(60), router_.get());
    ASSERT_TRUE(port.ok()) << port.status();
    auto metrics = WaitForPort(ports, "metrics", absl::Seconds(5), router_.get());
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_port_ = *metrics;
    stub_ = v1::Router::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", *port)));
    // The router's view of both nodes becomes exact (snapshot, then stream).
    for (int i = 0; i < 100 && !AllExact(); ++i) absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(AllExact());
  }
  void TearDown() override {
    if (router_ != nullptr) {
      EXPECT_EQ(router_->Stop(), 0);
    }
    nodes_.clear();
    shards_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  v1::GetRoutingStateResponse State() {
    grpc::ClientContext ctx;
    v1::GetRoutingStateResponse state;
    EXPECT_TRUE(stub_->GetRoutingState(&ctx, v1::GetRoutingStateRequest(), &state).ok());
    return state;
  }
  bool AllExact(int nodes = 2) {
    const v1::GetRoutingStateResponse s = State();
    if (s.nodes_size() != nodes) return false;
    for (const v1::NodeRoutingView& n : s.nodes()) {
      if (n.view() != v1::NODE_VIEW_EXACT) return false;
    }
    return true;
  }
  grpc::Status Recommend(const v1::RecommendRequest& req, v1::RecommendResponse* resp,
                         std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    return stub_->Recommend(&ctx, req, resp);
  }
  static void AddEvents(Rng& rng, int n, v1::RecommendRequest* r) {
    for (int i = 0; i < n; ++i) {
      v1::Event* e = r->add_history();
      e->add_feature_ids(rng() % 100000);
      e->add_feature_ids(rng() % 500);
    }
  }
  static void AddCandidates(Rng& rng, int n, v1::RecommendRequest* r) {
    for (int i = 0; i < n; ++i) {
      v1::Candidate* c = r->add_candidates();
      c->add_feature_ids(rng() % 100000);
      c->add_feature_ids(rng() % 500);
    }
  }

  std::string dir_;
  std::unique_ptr<testing::ShardCluster> shards_;
  std::vector<testing::NodeProcess> nodes_;
  std::unique_ptr<ChildProcess> router_;
  std::unique_ptr<v1::Router::Stub> stub_;
  int metrics_port_ = 0;
  int late_port_ = 0;
  std::string late_address_;
};

TEST_F(RouterIntegrationTest, ReturningUsersGoBackToTheirKvAndFailOverWhenANodeGoes) {
  Rng rng(7);
  std::vector<v1::RecommendRequest> users(6);
  std::vector<std::string> first_node(users.size());
  for (size_t u = 0; u < users.size(); ++u) {
    users[u].set_user_id(100 + u);
    AddEvents(rng, 30, &users[u]);
    AddCandidates(rng, 4, &users[u]);
    v1::RecommendResponse resp;
    ASSERT_TRUE(Recommend(users[u], &resp).ok());
    EXPECT_EQ(resp.scores_size(), 4);
    EXPECT_EQ(resp.cached_prefix_tokens(), 0u);
    first_node[u] = resp.node_id();
  }
  absl::SleepFor(absl::Milliseconds(300));  // the kv_stored events reach the router
  // Each returning user goes back to its node and reuses its K/V.
  for (size_t u = 0; u < users.size(); ++u) {
    AddEvents(rng, 10, &users[u]);
    v1::RecommendResponse resp;
    ASSERT_TRUE(Recommend(users[u], &resp).ok());
    EXPECT_EQ(resp.node_id(), first_node[u]) << "user " << u;
    EXPECT_EQ(resp.h_kv(), 1.0);
    EXPECT_EQ(resp.cached_prefix_tokens(), 30u) << "user " << u;
    EXPECT_FALSE(resp.stale_kv_hit());
  }
  const v1::GetRoutingStateResponse state = State();
  uint64_t resident = 0;
  for (const v1::NodeRoutingView& n : state.nodes()) resident += n.resident_users();
  EXPECT_EQ(resident, users.size());
  EXPECT_EQ(state.policy(), "hlem");
  const std::string metrics = testing::ScrapeMetrics(metrics_port_);
  for (const char* line : {"hlem_router_requests_total{code=\"OK\"} 12",
                           "hlem_router_decision_duration_seconds_count 12",
                           "hlem_router_locality_score_total{of=\"chosen\",signal=\"kv\"} 6",
                           // too few answers to calibrate yet: the configured share
                           "hlem_router_weight{signal=\"load\"} 0.333"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << "\n" << metrics.substr(0, 4000);
  }

  // node-a goes away (SIGTERM: it drains and exits): its users are served by node-b, and no
  // request fails.
  EXPECT_EQ(nodes_[0].process.Stop(), 0);
  for (size_t u = 0; u < users.size(); ++u) {
    AddEvents(rng, 2, &users[u]);
    v1::RecommendResponse resp;
    const grpc::Status st = Recommend(users[u], &resp);
    ASSERT_TRUE(st.ok()) << "user " << u << ": " << st.error_message();
    EXPECT_EQ(resp.node_id(), "node-b");
  }
  // Its health checks fail: it leaves the router's view.
  for (int i = 0; i < 100 && State().nodes_size() != 1; ++i) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_EQ(State().nodes_size(), 1);
  EXPECT_EQ(State().nodes(0).node_id(), "node-b");
  absl::SleepFor(absl::Milliseconds(1200));  // a metrics refresh: node-a's series are gone
  const std::string after = testing::ScrapeMetrics(metrics_port_);
  EXPECT_EQ(after.find("hlem_router_node_load{node=\"node-a\"}"), std::string::npos);
  EXPECT_NE(after.find("hlem_router_node_load{node=\"node-b\"}"), std::string::npos);

  // node-c starts on the third listed address: it joins, its view becomes exact, and it serves.
  auto late = testing::StartNode(HLEM_NODE_BINARY, dir_, dir_ + "/node.yaml", "node-c",
                                 shards_->addresses(), late_address_);
  ASSERT_TRUE(late.ok()) << late.status();
  nodes_.push_back(std::move(*late));
  for (int i = 0; i < 100 && !AllExact(2); ++i) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(AllExact(2));
  // With node-b gone too, node-c serves everyone.
  EXPECT_EQ(nodes_[1].process.Stop(), 0);
  for (size_t u = 0; u < users.size(); ++u) {
    AddEvents(rng, 2, &users[u]);
    v1::RecommendResponse resp;
    const grpc::Status st = Recommend(users[u], &resp);
    ASSERT_TRUE(st.ok()) << "user " << u << ": " << st.error_message();
    EXPECT_EQ(resp.node_id(), "node-c");
  }
}

TEST_F(RouterIntegrationTest, BadInputGetsClearErrors) {
  Rng rng(8);
  v1::RecommendRequest ok;
  ok.set_user_id(5);
  AddEvents(rng, 3, &ok);
  AddCandidates(rng, 2, &ok);
  v1::RecommendResponse resp;
  auto expect = [&](const v1::RecommendRequest& r, grpc::StatusCode code, const std::string& text,
                    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const grpc::Status st = Recommend(r, &resp, timeout);
    EXPECT_EQ(st.error_code(), code) << st.error_message();
    EXPECT_NE(st.error_message().find(text), std::string::npos) << st.error_message();
  };
  v1::RecommendRequest no_user = ok;
  no_user.set_user_id(0);
  expect(no_user, grpc::StatusCode::INVALID_ARGUMENT, "user_id");
  v1::RecommendRequest no_candidates = ok;
  no_candidates.clear_candidates();
  expect(no_candidates, grpc::StatusCode::INVALID_ARGUMENT, "candidates");
  v1::RecommendRequest many = ok;
  AddCandidates(rng, 600, &many);
  expect(many, grpc::StatusCode::INVALID_ARGUMENT, "exceeds the limit 512");
  v1::RecommendRequest ragged = ok;
  ragged.mutable_history(0)->add_feature_ids(1);
  expect(ragged, grpc::StatusCode::INVALID_ARGUMENT, "history[0].feature_ids");
  v1::RecommendRequest range = ok;
  range.mutable_candidates(0)->set_feature_ids(0, 100000);  // passed through from the node
  expect(range, grpc::StatusCode::OUT_OF_RANGE, "100000");
  // Delta mode with a prefix the node never gave out: the node's FAILED_PRECONDITION comes back.
  v1::RecommendRequest delta = ok;
  delta.mutable_delta()->set_length(3);
  delta.mutable_delta()->set_hash(12345);
  expect(delta, grpc::StatusCode::FAILED_PRECONDITION, "resend the full history");
  ASSERT_TRUE(Recommend(ok, &resp).ok());
}

}  // namespace
}  // namespace hlem
