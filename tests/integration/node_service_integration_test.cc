// The serving_node binary against a real embedding shard on loopback, called over gRPC as the
// router and the allocator call it: a returning user's requests compute only the new tokens and
// score exactly as a cold node does; bad input gets clear errors; SIGTERM drains and exits 0.

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_server.h"
#include "common/process.h"
#include "common/rng.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "hlem/v1/serving_node.grpc.pb.h"
#include "tests/testing/node_process.h"
#include "tests/testing/shard_cluster.h"

namespace hlem {
namespace {

namespace v1 = ::hlem::v1;

constexpr char kNode[] = R"(
node: {id: it-node, slo: 2s, window: 200ms, keep_windows: 1000, load_report_interval: 100ms}
memory: {pool_bytes: 16MiB, page_bytes: 64KiB, initial_alpha: 0.5}
queue: {max_batch: 8, batch_window: 1ms}
model:
  seed: 23
  layers: 2
  dim: 32
  heads: 2
  d_qk: 16
  d_v: 16
  head_hidden: 32
  targets: 2
  attn_norm: 64
  max_positions: 512
  features: [item, category]
  max_history: 300
  max_candidates: 32
  max_request_events: 1000
shards: {config: shards.yaml, transport: grpc}
)";

using testing::NodeProcess;

absl::StatusOr<NodeProcess> StartNode(const std::string& dir, const std::string& name,
                                      const std::vector<std::string>& shard_servers) {
  return testing::StartNode(HLEM_NODE_BINARY, dir, dir + "/node.yaml", name, shard_servers);
}

grpc::Status Infer(NodeProcess& n, const v1::InferRequest& req, v1::InferResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return n.stub->Infer(&ctx, req, resp);
}

void AddEvents(Rng& rng, int n, v1::InferRequest* r) {
  for (int i = 0; i < n; ++i) {
    v1::Event* e = r->add_history();
    e->add_feature_ids(rng() % 100000);
    e->add_feature_ids(rng() % 500);
  }
}

class NodeServiceIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/hlem_node_svc_it_", getpid());
    auto cluster =
        testing::StartShardsForNodes(HLEM_SHARD_BINARY, dir_, testing::kTestShardsYaml, kNode);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }
  void TearDown() override {
    cluster_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);  // keep the logs of a failure
  }
  std::string dir_;
  std::unique_ptr<testing::ShardCluster> cluster_;
};

TEST_F(NodeServiceIntegrationTest, ReturningUserComputesOnlyNewTokensAndScoresLikeAColdNode) {
  auto warm = StartNode(dir_, "warm", cluster_->addresses());
  ASSERT_TRUE(warm.ok()) << warm.status();
  Rng rng(4);
  v1::InferRequest req;
  req.set_user_id(42);
  for (int c = 0; c < 8; ++c) {
    v1::Candidate* cand = req.add_candidates();
    cand->add_feature_ids(rng() % 100000);
    cand->add_feature_ids(rng() % 500);
  }
  uint64_t reused = 0;
  for (int request = 0; request < 3; ++request) {
    AddEvents(rng, 40, &req);
    req.set_expected_kv_resident(request > 0);
    v1::InferResponse got;
    grpc::Status st = Infer(*warm, req, &got);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(got.cached_prefix_tokens(), 40u * request);
    EXPECT_EQ(got.computed_tokens(), 40u + 8u);
    EXPECT_FALSE(got.stale_kv_hit());
    EXPECT_EQ(got.scores_size(), 16);
    reused += got.cached_prefix_tokens();
    // A node that never saw the user.
    auto cold = StartNode(dir_, absl::StrCat("cold", request), cluster_->addresses());
    ASSERT_TRUE(cold.ok()) << cold.status();
    v1::InferResponse want;
    ASSERT_TRUE(Infer(*cold, req, &want).ok());
    EXPECT_EQ(want.cached_prefix_tokens(), 0u);
    for (int i = 0; i < want.scores_size(); ++i) {
      EXPECT_NEAR(got.scores(i), want.scores(i), 1e-4 * std::max(1.0f, std::abs(want.scores(i))))
          << "request " << request << " score " << i;
    }
    EXPECT_EQ(cold->process.Stop(), 0);
  }
  // The node's own statistics agree: a closed window counts the reused tokens.
  absl::SleepFor(absl::Milliseconds(500));
  grpc::ClientContext ctx;
  v1::GetStateRequest state_req;
  // Every window the node keeps (keep_windows): a slow machine (or a TSan build) may take
  // more than 100 windows of 200 ms from the first request to here.
  state_req.set_max_windows(1000);
  v1::GetStateResponse state;
  ASSERT_TRUE(warm->stub->GetState(&ctx, state_req, &state).ok());
  uint64_t requests = 0;
  double weighted_hits = 0;
  for (const v1::WindowStats& w : state.windows()) {
    requests += w.requests();
    weighted_hits += w.kv_hit_rate();
  }
  EXPECT_EQ(requests, 3u);
  EXPECT_GT(weighted_hits, 0.0);
  EXPECT_EQ(state.current().kv_resident_users(), 1u);
  const std::string metrics = testing::ScrapeMetrics(warm->metrics_port);
  for (const char* line :
       {"hlem_node_requests_total{code=\"OK\"} 3", "hlem_node_kv_tokens_total{kind=\"reused\"} 120",
        "hlem_node_batch_size_count 3", "hlem_node_alpha{kind=\"effective\"} 0.5"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << "\n" << metrics.substr(0, 3000);
  }
  EXPECT_EQ(warm->process.Stop(), 0);  // SIGTERM: drain, exit 0
  EXPECT_EQ(reused, 120u);
}

TEST_F(NodeServiceIntegrationTest, BadInputGetsClearErrors) {
  auto node = StartNode(dir_, "node", cluster_->addresses());
  ASSERT_TRUE(node.ok()) << node.status();
  Rng rng(5);
  auto expect = [&](const v1::InferRequest& r, grpc::StatusCode code, const std::string& text) {
    v1::InferResponse resp;
    grpc::Status st = Infer(*node, r, &resp);
    EXPECT_EQ(st.error_code(), code) << st.error_message();
    EXPECT_NE(st.error_message().find(text), std::string::npos) << st.error_message();
  };
  v1::InferRequest base;
  base.set_user_id(1);
  AddEvents(rng, 5, &base);
  expect(base, grpc::StatusCode::INVALID_ARGUMENT, "candidates");

  v1::InferRequest extra_table = base;
  v1::Candidate* c = extra_table.add_candidates();
  c->add_feature_ids(1);
  c->add_feature_ids(2);
  c->add_feature_ids(3);  // a third feature table the model does not have
  expect(extra_table, grpc::StatusCode::INVALID_ARGUMENT, "candidates[0].feature_ids: 3 ids");

  v1::InferRequest range = base;
  c = range.add_candidates();
  c->add_feature_ids(100000);  // item has 100000 rows
  c->add_feature_ids(0);
  expect(range, grpc::StatusCode::OUT_OF_RANGE, "100000");

  v1::InferRequest too_long;
  AddEvents(rng, 1001, &too_long);
  c = too_long.add_candidates();
  c->add_feature_ids(1);
  c->add_feature_ids(1);
  expect(too_long, grpc::StatusCode::INVALID_ARGUMENT, "exceeds the limit 1000");

  auto set_alpha = [&](double alpha, uint64_t epoch, uint64_t id) {
    grpc::ClientContext ctx;
    v1::SetAlphaRequest r;
    r.set_alpha(alpha);
    r.set_allocator_epoch(epoch);
    r.set_decision_id(id);
    v1::SetAlphaResponse resp;
    return node->admin->SetAlpha(&ctx, r, &resp);
  };
  EXPECT_EQ(set_alpha(1.01, 1, 1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(set_alpha(0.7, 5, 3).ok());
  grpc::Status stale = set_alpha(0.2, 4, 9);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << stale.error_message();
  EXPECT_NE(stale.error_message().find("stale"), std::string::npos) << stale.error_message();
  // The admin service is not on the serving port.
  {
    auto wrong = v1::ServingNodeAdmin::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", node->port)));
    grpc::ClientContext ctx;
    v1::SetAlphaRequest r;
    v1::SetAlphaResponse resp;
    EXPECT_EQ(wrong->SetAlpha(&ctx, r, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  EXPECT_EQ(node->process.Stop(), 0);
}

}  // namespace
}  // namespace hlem
