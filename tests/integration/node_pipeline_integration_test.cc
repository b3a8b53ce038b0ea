// The serving node's request pipeline against a real embedding shard on loopback: the rows come
// over the shard client (gRPC), the model is the real HSTU, and a returning user's requests
// compute only the new tokens and score exactly as a fresh node does.

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/rng.h"
#include "embedding_shard/client/shard_client_factory.h"
#include "gtest/gtest.h"
#include "serving_node/core/pipeline.h"
#include "serving_node/model/hstu_model.h"
#include "serving_node/model/test_node.h"
#include "serving_node/service/shard_row_source.h"
#include "tests/testing/node_process.h"
#include "tests/testing/shard_cluster.h"

namespace hlem::serving {
namespace {

constexpr uint32_t kDim = 32;

// One node over the shard cluster's client.
struct Node {
  Node(HstuModel& model, RowSource& source, Clock& clock)
      : node(model, source, clock, {{.table_id = 0, .rows = 100000}, {.table_id = 1, .rows = 500}},
             300),
        pipeline(node.pipeline) {}
  testing::TestNode node;
  std::unique_ptr<Pipeline>& pipeline;
};

TEST(NodePipelineIntegrationTest, ReturningUserOverARealShard) {
  hlem::testing::ShardClusterOptions options;
  options.binary = HLEM_SHARD_BINARY;
  options.work_dir = absl::StrCat(::testing::TempDir(), "/hlem_node_it_", getpid());
  options.config_yaml = hlem::testing::kTestShardsYaml;
  auto cluster = hlem::testing::ShardCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RealClock clock;
  shard::ShardClientSetup setup;
  setup.cluster = (*cluster)->config();
  setup.transport = shard::ClientTransport::kGrpc;
  auto client = shard::ConnectShardClient(setup, clock);
  ASSERT_TRUE(client.ok()) << client.status();
  ShardRowSource source(**client);

  auto model = *HstuModel::CreateRandom({.layers = 2,
                                         .dim = kDim,
                                         .heads = 2,
                                         .d_qk = 16,
                                         .d_v = 16,
                                         .head_hidden = 32,
                                         .targets = 2,
                                         .attn_norm = 64,
                                         .max_positions = 512},
                                        23);
  Node warm(*model, source, clock);
  Rng rng(4);
  std::vector<uint64_t> history;
  for (int request = 0; request < 3; ++request) {
    for (int i = 0; i < 40; ++i) {
      history.push_back(rng() % 100000);
      history.push_back(rng() % 500);
    }
    std::vector<uint64_t> cand;
    for (int c = 0; c < 8; ++c) {
      cand.push_back(rng() % 100000);
      cand.push_back(rng() % 500);
    }
    const InferInput in{.user = 42, .history = history, .candidates = cand};
    auto got = warm.pipeline->Infer(in);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->cached_prefix_tokens, 40u * request);
    EXPECT_EQ(got->computed_tokens, 40u + 8u);
    EXPECT_GT(got->emb_misses, 0u);
    Node cold(*model, source, clock);
    auto want = cold.pipeline->Infer(in);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(got->scores.size(), 16u);
    testing::ExpectScoresNear(got->scores, want->scores, absl::StrCat("request ", request));
  }
  // A row past the table is the caller's error, before anything is fetched.
  auto bad = warm.pipeline->Infer({.user = 42, .history = {100000, 0}, .candidates = {1, 1}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange) << bad.status();
}

}  // namespace
}  // namespace hlem::serving
