// A whole serving node on the GPU (LocalNode with the `cuda` device and the CUDA model runner, as
// NodeStack builds it for memory.device: cuda): embedding misses copied into the cudaMalloc'd
// pool, each token's rows summed there (SumRows), K/V pages in the pool, the HSTU forward on the
// GPU reading its inputs in place. Its
// scores must be the model's (HstuForwardHost over the same weights and the table rows) for a
// returning user whose K/V are reused and for a batch of users. Skipped without a GPU (CI); the
// GPU host runs it from the bundle (scripts/gpu-check.sh --bundle / --tests). No torch.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "serving_node/core/hstu_flat.h"
#include "serving_node/core/pipeline_testing.h"
#include "serving_node/device/cuda_device.h"
#include "serving_node/device/cuda_model_runner.h"
#include "serving_node/device/local_node.h"

namespace hlem::serving {
namespace {

using testing::Embedding;
using testing::kFeatures;

HstuFlatShape NodeShape() {
  HstuFlatShape s;
  s.layers = 2;
  s.dim = testing::kDim;  // the fake tables' row width
  s.heads = 2;
  s.d_qk = 8;
  s.d_v = 16;
  s.head_hidden = 16;
  s.targets = 1;
  s.max_positions = 512;
  s.attn_norm = 32;
  return s;
}

TEST(CudaModelRunnerTest, CreateSaysWhyWithoutADevice) {
  if (cuda::CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  auto runner = CudaModelRunner::Create(RandomHstuFlatWeights(NodeShape(), 1));
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kUnavailable) << runner.status();
  HstuFlatWeights bad = RandomHstuFlatWeights(NodeShape(), 1);
  bad.head_b2.clear();
  EXPECT_EQ(CudaModelRunner::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

class CudaNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    weights_ = RandomHstuFlatWeights(NodeShape(), 23);
    auto runner = CudaModelRunner::Create(weights_);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = std::move(*runner);
    LocalNodeOptions o;
    o.node.node_id = "gpu-node";
    o.node.slo = absl::Seconds(10);
    o.pool_bytes = 64 << 20;
    o.page_bytes = 64 << 10;
    o.memory.initial_alpha = 0.5;
    o.pipeline = {.features = kFeatures, .max_candidates = 64, .max_history = 400};
    o.make_device = [](uint64_t pool_bytes) -> absl::StatusOr<PoolDevice> {
      auto device = CudaDevice::Create({.pool_bytes = pool_bytes});
      if (!device.ok()) return device.status();
      std::byte* pool = (*device)->cuda_pool().pool();
      return PoolDevice{.device = std::move(*device), .runner_pool = pool};
    };
    auto node = LocalNode::Build(o, source_, *runner_, 1, clock_);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    node_->Start();
  }

  // The model's scores for the history and candidates, from the table rows on the host.
  std::vector<float> Want(const std::vector<uint64_t>& history,
                          const std::vector<uint64_t>& candidates) const {
    std::vector<float> h, c;
    for (size_t t = 0; t < history.size() / 2; ++t) {
      const std::vector<float> e = Embedding(history, t);
      h.insert(h.end(), e.begin(), e.end());
    }
    for (size_t t = 0; t < candidates.size() / 2; ++t) {
      const std::vector<float> e = Embedding(candidates, t);
      c.insert(c.end(), e.begin(), e.end());
    }
    std::vector<float> scores(candidates.size() / 2);
    HstuForwardHost(weights_, h.data(), static_cast<uint32_t>(history.size() / 2), c.data(),
                    static_cast<uint32_t>(candidates.size() / 2), scores.data());
    return scores;
  }

  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                          const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::abs(double{got[i]} - want[i]));
      scale = std::max(scale, std::abs(double{want[i]}));
    }
    EXPECT_LE(diff, 1e-3 * scale) << what << ": max abs diff " << diff << ", scale " << scale;
  }

  RealClock clock_;
  testing::FakeRowSource source_;
  HstuFlatWeights weights_;
  std::unique_ptr<CudaModelRunner> runner_;
  std::unique_ptr<LocalNode> node_;
};

TEST_F(CudaNodeTest, AReturningUserReusesItsKvAndScoresAsTheModel) {
  Rng rng(5);
  std::vector<uint64_t> history;
  for (int request = 0; request < 4; ++request) {
    const std::vector<uint64_t> more = testing::RandomEvents(rng, 20 + 15 * request);
    history.insert(history.end(), more.begin(), more.end());
    const std::vector<uint64_t> cand = testing::RandomEvents(rng, 7);
    auto got = node_->pipeline->Infer({.user = 9, .history = history, .candidates = cand});
    ASSERT_TRUE(got.ok()) << got.status();
    if (request > 0) {
      EXPECT_GT(got->cached_prefix_tokens, 0u) << "request " << request;
    }
    ExpectClose(got->scores, Want(history, cand), absl::StrCat("request ", request));
  }
  EXPECT_EQ(node_->device->name().rfind("cuda:", 0), 0u) << node_->device->name();
}

// A step the runner would misread is refused before any GPU work, with the step and the field
// named and the code the ModelRunner interface promises.
TEST_F(CudaNodeTest, TheRunnerRefusesBadStepsNamingThem) {
  const HstuFlatShape shape = NodeShape();
  KvGeometry g{
      .layers = shape.layers, .kv_dim = shape.kv_dim(), .dtype_bytes = 4, .page_bytes = 64 << 10};
  g.page_tokens = static_cast<uint32_t>(g.page_bytes / g.token_bytes());
  std::vector<float> emb(3 * shape.dim), scores(2 * shape.targets);
  const std::vector<uint64_t> pages = {0};
  std::byte* pool = static_cast<CudaDevice&>(*node_->device).cuda_pool().pool();
  const ModelStep good{.kv = {g, pool, pages},
                       .cached_len = 0,
                       .new_history_emb = {emb.data(), shape.dim},
                       .candidate_emb = {emb.data() + shape.dim, 2 * shape.dim},
                       .scores = scores};
  auto refused = [&](ModelStep bad, absl::StatusCode code, const std::string& want) {
    const std::vector<ModelStep> steps = {good, bad};
    const absl::Status st = runner_->Run(steps);
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(want), std::string::npos) << st;
  };
  ModelStep bad = good;
  bad.candidate_emb = {emb.data(), shape.dim + 1};
  refused(bad, absl::StatusCode::kInvalidArgument, "step 1: embeddings are not a whole number");
  bad = good;
  bad.cached_len = shape.max_positions;
  refused(bad, absl::StatusCode::kOutOfRange, "step 1: history of");
  bad = good;
  bad.scores = {scores.data(), 1};
  refused(bad, absl::StatusCode::kInvalidArgument, "step 1: scores");
  bad = good;
  bad.kv.geometry.kv_dim += 1;
  refused(bad, absl::StatusCode::kInvalidArgument, "step 1: kv pages");
}

TEST_F(CudaNodeTest, ABatchOfUsersScoresAsTheModel) {
  Rng rng(8);
  std::vector<InferInput> batch;
  for (uint64_t user = 0; user < 5; ++user) {
    batch.push_back({.user = user,
                     .history = testing::RandomEvents(rng, 3 + 40 * user),
                     .candidates = testing::RandomEvents(rng, 1 + 3 * user)});
  }
  for (int round = 0; round < 2; ++round) {  // cold, then every user's K/V from the pool
    std::vector<absl::StatusOr<InferOutput>> got = node_->pipeline->InferBatch(batch);
    for (size_t i = 0; i < batch.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      ExpectClose(got[i]->scores, Want(batch[i].history, batch[i].candidates),
                  absl::StrCat("round ", round, ", user ", i));
    }
  }
}

}  // namespace
}  // namespace hlem::serving
