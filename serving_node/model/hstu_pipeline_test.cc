// The node pipeline with the real HSTU model on the cpu device: a returning user's requests
// compute only the new tokens and score exactly as a cold node does.

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "serving_node/core/pipeline.h"
#include "serving_node/model/hstu_model.h"
#include "serving_node/model/test_node.h"

namespace hlem::serving {
namespace {

constexpr uint32_t kDim = 32;

// Rows of table t: deterministic small floats.
class TableSource final : public RowSource {
 public:
  absl::Status Fetch(uint32_t table, std::span<const uint64_t> rows, std::span<std::byte> out,
                     absl::Time) override {
    float* f = reinterpret_cast<float*>(out.data());
    for (size_t r = 0; r < rows.size(); ++r) {
      for (uint32_t d = 0; d < kDim; ++d) {
        f[r * kDim + d] = static_cast<float>(KeyedHash(table, rows[r], d) % 1001) / 5000.0f - 0.1f;
      }
    }
    return absl::OkStatus();
  }
};

// One node over the shared model, rows from TableSource.
struct Node {
  explicit Node(HstuModel& model)
      : node(model, source, clock, {{.table_id = 0, .rows = 5000}, {.table_id = 1, .rows = 100}},
             400),
        pipeline(node.pipeline) {}
  RealClock clock;
  TableSource source;
  testing::TestNode node;
  std::unique_ptr<Pipeline>& pipeline;
};

std::unique_ptr<HstuModel> SmallModel() {
  return *HstuModel::CreateRandom({.layers = 2,
                                   .dim = kDim,
                                   .heads = 2,
                                   .d_qk = 8,
                                   .d_v = 16,
                                   .head_hidden = 16,
                                   .targets = 1,
                                   .attn_norm = 32,
                                   .max_positions = 512},
                                  17);
}

std::vector<uint64_t> RandomEvents(Rng& rng, int n) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(rng() % 5000);
    ids.push_back(rng() % 100);
  }
  return ids;
}

TEST(HstuPipelineTest, ReturningUserScoresLikeAColdNode) {
  auto model = SmallModel();
  Node warm(*model);
  Rng rng(5);
  std::vector<uint64_t> history;
  for (int request = 0; request < 4; ++request) {
    const std::vector<uint64_t> more = RandomEvents(rng, 25 + 10 * request);
    history.insert(history.end(), more.begin(), more.end());
    const std::vector<uint64_t> cand = RandomEvents(rng, 6);
    auto w = warm.pipeline->Infer({.user = 1, .history = history, .candidates = cand});
    ASSERT_TRUE(w.ok()) << w.status();
    Node cold(*model);
    auto c = cold.pipeline->Infer({.user = 1, .history = history, .candidates = cand});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->cached_prefix_tokens, 0u);
    if (request > 0) {
      EXPECT_GT(w->cached_prefix_tokens, 0u) << "request " << request;
      EXPECT_EQ(w->computed_tokens, history.size() / 2 - w->cached_prefix_tokens + 6);
    }
    testing::ExpectScoresNear(w->scores, c->scores, absl::StrCat("request ", request));
  }
}

// Users of different history lengths in one batch (one model pass) score as each would alone
// on a fresh node.
TEST(HstuPipelineTest, ABatchScoresLikeSingleRequests) {
  auto model = SmallModel();
  Node warm(*model);
  Rng rng(8);
  std::vector<InferInput> batch;
  for (uint64_t user = 0; user < 5; ++user) {
    batch.push_back({.user = user,
                     .history = RandomEvents(rng, 5 + 30 * static_cast<int>(user)),
                     .candidates = RandomEvents(rng, 1 + static_cast<int>(user))});
  }
  std::vector<absl::StatusOr<InferOutput>> got = warm.pipeline->InferBatch(batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    Node cold(*model);
    auto want = cold.pipeline->Infer(batch[i]);
    ASSERT_TRUE(want.ok()) << want.status();
    testing::ExpectScoresNear(got[i]->scores, want->scores, absl::StrCat("user ", i));
  }
}

}  // namespace
}  // namespace hlem::serving
