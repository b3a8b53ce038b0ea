#include "router/core/calibration.h"

#include "gtest/gtest.h"

namespace hlem::router {
namespace {

TEST(CostCalibratorTest, LearnsTheMissCostsAndKeepsTheLoadShare) {
  auto c = *CostCalibrator::Create({.half_life = 100, .min_samples = 10},
                                   {.c_kv = 1, .c_emb = 1, .c_load = 1});
  // Before enough answers: the configured weights.
  CalibrationState st = c->State();
  EXPECT_FALSE(st.calibrated);
  EXPECT_DOUBLE_EQ(st.weights.kv, 1.0 / 3);
  // 1 µs per computed token over 1000-token histories (Ĉ_kv = 1 ms); 10 µs per missed row over
  // 200 rows per request (Ĉ_emb = 2 ms).
  for (int i = 0; i < 200; ++i) {
    c->Observe({.computed_tokens = 100,
                .history_tokens = 1000,
                .emb_hits = 150,
                .emb_misses = 50,
                .compute_seconds = 100e-6,
                .fetch_seconds = 500e-6});
  }
  st = c->State();
  ASSERT_TRUE(st.calibrated);
  EXPECT_NEAR(st.c_kv, 1e-3, 1e-9);
  EXPECT_NEAR(st.c_emb, 2e-3, 1e-9);
  EXPECT_NEAR(st.weights.load, 1.0 / 3, 1e-12);
  EXPECT_NEAR(st.weights.kv, 2.0 / 9, 1e-9);
  EXPECT_NEAR(st.weights.emb, 4.0 / 9, 1e-9);

  // The network gets 4× slower: the EMB weight follows within a few half-lives.
  for (int i = 0; i < 1000; ++i) {
    c->Observe({.computed_tokens = 100,
                .history_tokens = 1000,
                .emb_hits = 150,
                .emb_misses = 50,
                .compute_seconds = 100e-6,
                .fetch_seconds = 2e-3});
  }
  st = c->State();
  EXPECT_NEAR(st.c_emb, 8e-3, 1e-4);
  EXPECT_NEAR(st.weights.emb, 2.0 / 3 * 8 / 9, 1e-2);
}

TEST(CostCalibratorTest, LearnsTheLoadCostInSecondsWhenAnswersCarryTheirLoad) {
  auto c = *CostCalibrator::Create({.half_life = 100, .min_samples = 10},
                                   {.c_kv = 1, .c_emb = 1, .c_load = 1});
  // Ĉ_kv = 1 ms, Ĉ_emb = 2 ms as above; answers routed at load 0.1 wait 1.7 ms and at 0.3
  // wait 3.1 ms: 1 ms whatever the load (the batch in progress) + 7 ms per unit (Ĉ_ld = 7 ms).
  for (int i = 0; i < 200; ++i) {
    const bool busy = i % 2 == 1;
    c->Observe({.computed_tokens = 100,
                .history_tokens = 1000,
                .emb_hits = 150,
                .emb_misses = 50,
                .compute_seconds = 100e-6,
                .fetch_seconds = 500e-6,
                .queue_seconds = busy ? 3.1e-3 : 1.7e-3,
                .load = busy ? 0.3 : 0.1});
  }
  CalibrationState st = c->State();
  ASSERT_TRUE(st.calibrated);
  EXPECT_EQ(st.load_samples, 200u);
  EXPECT_NEAR(st.c_load, 7e-3, 2e-4);
  EXPECT_NEAR(st.weights.kv, 1.0 / 10, 3e-3);
  EXPECT_NEAR(st.weights.emb, 2.0 / 10, 5e-3);
  EXPECT_NEAR(st.weights.load, 7.0 / 10, 5e-3);
  EXPECT_NEAR(st.weights.kv + st.weights.emb + st.weights.load, 1, 1e-12);

  // A cluster whose load does not vary says nothing about a loaded node, however long its
  // requests wait: the configured share stands.
  auto idle = *CostCalibrator::Create({.half_life = 100, .min_samples = 10},
                                      {.c_kv = 1, .c_emb = 1, .c_load = 1});
  for (int i = 0; i < 200; ++i) {
    idle->Observe({.computed_tokens = 100,
                   .history_tokens = 1000,
                   .emb_hits = 150,
                   .emb_misses = 50,
                   .compute_seconds = 100e-6,
                   .fetch_seconds = 500e-6,
                   .queue_seconds = 2e-3,
                   .load = 0.01});
  }
  st = idle->State();
  ASSERT_TRUE(st.calibrated);
  EXPECT_EQ(st.c_load, 0);
  EXPECT_NEAR(st.weights.load, 1.0 / 3, 1e-12);
}

TEST(CostCalibratorTest, AnswersWithoutComputeOrMissesDoNotCount) {
  auto c = *CostCalibrator::Create({.min_samples = 1}, {});
  c->Observe({.computed_tokens = 0, .history_tokens = 10, .emb_hits = 10, .emb_misses = 0});
  const CalibrationState st = c->State();
  EXPECT_EQ(st.compute_samples, 0u);
  EXPECT_EQ(st.fetch_samples, 0u);
  EXPECT_FALSE(st.calibrated);
}

TEST(CostCalibratorTest, RejectsBadOptions) {
  EXPECT_FALSE(CostCalibrator::Create({.half_life = 0.5}, {}).ok());
  EXPECT_FALSE(CostCalibrator::Create({}, {.c_kv = 0, .c_emb = 0, .c_load = 0}).ok());
}

}  // namespace
}  // namespace hlem::router
