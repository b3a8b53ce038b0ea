#include "allocator_service/core/controller.h"

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace hlem::allocator {
namespace {

constexpr double kSlo = 0.030;

WindowState Window(uint64_t index, double p99, double hot_ratio, double alpha) {
  return {.index = index,
          .requests = 1000,
          .hot_user_ratio = hot_ratio,
          .kv_hit_rate = 0.3,
          .emb_hit_rate = 0.7,
          .mean_seq_len_norm = 0.5,
          .slo_violation_fraction = p99 > kSlo ? 0.02 : 0.0,
          .alpha = alpha,
          .p99_seconds = p99,
          .slo_seconds = kSlo};
}

TEST(FeaturesTest, SevenFeaturesInTheUnitInterval) {
  WindowState w = Window(0, 0.060, 1.7, 0.4);  // out-of-range inputs are clamped
  w.kv_hit_rate = -0.2;
  const std::array<double, kNumFeatures> f = Features(w);
  EXPECT_DOUBLE_EQ(f[0], 1.0);  // hot-user ratio, clamped
  EXPECT_DOUBLE_EQ(f[1], 0.0);  // KV hit rate, clamped
  EXPECT_DOUBLE_EQ(f[5], 0.4);  // α
  EXPECT_DOUBLE_EQ(f[6], 0.5);  // P99 ÷ SLO = 2, ÷ cap 4
  w.p99_seconds = 1.0;          // far over the cap
  EXPECT_DOUBLE_EQ(Features(w)[6], 1.0);
  for (double v : f) {
    EXPECT_GE(v, 0.0);
    EXPECT_LE(v, 1.0);
  }
}

TEST(FeaturesTest, RewardIsSatisfactionMinusTheNormalisedOverrun) {
  WindowState w = Window(0, 0.020, 0.2, 0.5);
  w.slo_violation_fraction = 0.01;
  EXPECT_DOUBLE_EQ(Reward(w), 0.99);  // P99 under the SLO: no penalty
  w.p99_seconds = 0.045;              // 15 ms over a 30 ms SLO: −0.5
  w.slo_violation_fraction = 0.05;
  EXPECT_NEAR(Reward(w), 0.95 - 0.5, 1e-12);
  w.p99_seconds = 3.0;  // 100× the SLO: the overrun is capped at p99_norm_cap (4) − 1
  w.slo_violation_fraction = 1;
  EXPECT_NEAR(Reward(w), -3.0, 1e-12);
}

TEST(StaticTest, AlwaysTheSameAlphaUnclipped) {
  std::unique_ptr<Controller> kv_only = MakeStatic(0.0);
  std::vector<WindowState> h = {Window(0, 0.5, 0.9, 0.0)};
  const Decision d = kv_only->Decide(h);
  EXPECT_EQ(d.alpha, 0.0);  // KV-only is outside the learned controllers' clip range
  EXPECT_EQ(d.reason, Reason::kStatic);
}

// Runs `c` over windows whose P99 and hot ratio come from the given functions, feeding each
// decision back as the next window's α. Returns the decisions.
std::vector<Decision> Drive(Controller& c, int windows, double alpha0,
                            const std::function<double(int)>& p99,
                            const std::function<double(int)>& hot) {
  std::vector<WindowState> history;
  std::vector<Decision> out;
  double alpha = alpha0;
  for (int t = 0; t < windows; ++t) {
    history.push_back(Window(static_cast<uint64_t>(t), p99(t), hot(t), alpha));
    out.push_back(c.Decide(history));
    alpha = out.back().alpha;
  }
  return out;
}

TEST(RecoveryTest, DoesNotFireInASteadyNoisyRun) {
  auto c = MakeRecovery(MakeStatic(0.5));
  ASSERT_TRUE(c.ok()) << c.status();
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.020, 0.0015);  // 20 ms ± 1.5 ms, far under 0.8·SLO
  std::vector<double> p99(500);
  for (double& v : p99) v = noise(rng);
  const std::vector<Decision> d = Drive(
      **c, 500, 0.5, [&](int t) { return p99[t]; }, [](int) { return 0.2; });
  for (const Decision& x : d) {
    EXPECT_NE(x.reason, Reason::kRecovery) << x.detail;
    EXPECT_EQ(x.alpha, 0.5);
  }
}

TEST(RecoveryTest, FiresOnTheSecondBurstWindowLowersAlphaAndHandsBack) {
  auto c = MakeRecovery(MakeStatic(0.7));
  ASSERT_TRUE(c.ok()) << c.status();
  // 20 quiet windows at 20-21 ms, a burst of 6 windows at 60 ms with hot ratio 0.5, then quiet
  // at 19 ms (under the pre-burst EMA + σ).
  auto p99 = [](int t) { return t < 20 ? 0.020 + 0.0005 * (t % 3) : t < 26 ? 0.060 : 0.019; };
  auto hot = [](int t) { return t >= 20 && t < 26 ? 0.5 : 0.2; };
  const std::vector<Decision> d = Drive(**c, 40, 0.7, p99, hot);
  EXPECT_EQ(d[20].reason, Reason::kStatic);  // one window over is not enough
  EXPECT_EQ(d[21].reason, Reason::kRecovery) << d[21].detail;
  double last = 0.7;
  for (int t = 21; t < 26; ++t) {
    EXPECT_EQ(d[t].reason, Reason::kRecovery);
    EXPECT_LE(d[t].alpha, last);
    EXPECT_GE(last - d[t].alpha, 0.0);
    EXPECT_LE(last - d[t].alpha, 0.15 + 1e-12);  // at most 0.15 per window
    EXPECT_GE(d[t].alpha, 0.1);                  // never below the clip range
    last = d[t].alpha;
  }
  EXPECT_LE(d[25].alpha, 0.1 + 1e-12);  // five full steps from 0.7 reach the floor
  // Quiet from window 26: holds for one window, exits after the second, the inner controller
  // decides again.
  EXPECT_EQ(d[26].reason, Reason::kRecovery);
  EXPECT_EQ(d[26].alpha, d[25].alpha);
  EXPECT_EQ(d[27].reason, Reason::kStatic);
  EXPECT_EQ(d[27].alpha, 0.7);
  for (int t = 28; t < 40; ++t) EXPECT_EQ(d[t].reason, Reason::kStatic) << t;
}

TEST(RecoveryTest, HoldsAlphaWhenFewUsersAreHot) {
  auto c = MakeRecovery(MakeStatic(0.6));
  ASSERT_TRUE(c.ok());
  auto p99 = [](int t) { return t >= 15 ? 0.080 : 0.020; };
  const std::vector<Decision> d = Drive(**c, 20, 0.6, p99, [](int) { return 0.1; });
  EXPECT_EQ(d[16].reason, Reason::kRecovery);
  EXPECT_EQ(d[16].alpha, 0.6);  // KV would not help: nobody returns
}

TEST(RecoveryTest, NeedsHistoryBeforeJudging) {
  auto c = MakeRecovery(MakeStatic(0.5));
  ASSERT_TRUE(c.ok());
  // A bad start (caches filling) is not a burst: fewer than 10 windows to compare with.
  const std::vector<Decision> d = Drive(
      **c, 10, 0.5, [](int) { return 0.2; }, [](int) { return 0.9; });
  for (const Decision& x : d) EXPECT_EQ(x.reason, Reason::kStatic);
}

// A plant whose P99 is convex in α (minimum 0.5·SLO at α = 0.6): from α = 0.2, where P99 is just
// over the 0.8·SLO target, the first step goes the wrong way (toward KV, the default sign), the
// controller learns the sign from the response and settles on the target.
TEST(PidTest, LearnsTheSignAndSettlesOnTheTarget) {
  auto c = MakePid();
  ASSERT_TRUE(c.ok()) << c.status();
  auto plant = [](double alpha) { return kSlo * (0.5 + 2 * (alpha - 0.6) * (alpha - 0.6)); };
  std::vector<WindowState> history;
  double alpha = 0.2;
  std::vector<double> steps;
  for (int t = 0; t < 80; ++t) {
    history.push_back(Window(static_cast<uint64_t>(t), plant(alpha), 0.3, alpha));
    const Decision d = (*c)->Decide(history);
    EXPECT_EQ(d.reason, Reason::kBaseline);
    EXPECT_GE(d.alpha, 0.1);
    EXPECT_LE(d.alpha, 0.9);
    EXPECT_LE(std::abs(d.alpha - alpha), 0.06 + 1e-12) << d.detail;
    steps.push_back(d.alpha - alpha);
    alpha = d.alpha;
  }
  EXPECT_LT(steps[0], 0);  // the default sign: toward KV first
  EXPECT_NEAR(plant(alpha), 0.8 * kSlo, 0.05 * kSlo) << "alpha " << alpha;
}

TEST(PidTest, HoldsWithoutRequestsAndRejectsBadOptions) {
  auto c = MakePid();
  ASSERT_TRUE(c.ok());
  WindowState idle = Window(0, 0.5, 0.3, 0.4);
  idle.requests = 0;
  std::vector<WindowState> h = {idle};
  const Decision d = (*c)->Decide(h);
  EXPECT_EQ(d.reason, Reason::kHold);
  EXPECT_EQ(d.alpha, 0.4);
  EXPECT_FALSE(MakePid({.kp = -1}).ok());
  EXPECT_FALSE(MakePid({.target_fraction = 0}).ok());
}

// A one-layer actor on the features: action 0 (−0.06) scores 10 × the P99 feature, action 3 (0)
// scores 1, the rest 0 — so it moves α toward KV while P99 ÷ SLO ÷ 4 > 0.1 and holds otherwise.
TEST(PolicyTest, AppliesTheBestScoringActionWithinTheBounds) {
  DenseLayer d{.in = kNumFeatures, .out = kActions.size()};
  d.weights.assign(static_cast<size_t>(d.in) * d.out, 0.0f);
  d.bias.assign(d.out, 0.0f);
  d.weights[0 * kNumFeatures + 6] = 10;  // action 0 <- the P99 feature
  d.bias[3] = 1;                         // action 3 (Δα 0)
  Normaliser identity{.mean = std::vector<float>(kNumFeatures, 0),
                      .std = std::vector<float>(kNumFeatures, 1)};
  auto actor = Mlp::Create(identity, {d}, Activation::kTanh);
  ASSERT_TRUE(actor.ok()) << actor.status();
  auto c = MakePolicy(std::move(*actor));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<WindowState> h = {Window(0, 0.030, 0.3, 0.5)};  // P99 = SLO: feature 0.25
  Decision d1 = (*c)->Decide(h);
  EXPECT_EQ(d1.reason, Reason::kPolicy);
  EXPECT_NEAR(d1.alpha, 0.44, 1e-12) << d1.detail;
  h.push_back(Window(1, 0.006, 0.3, 0.44));  // P99 = 0.2 SLO: feature 0.05 -> hold
  EXPECT_NEAR((*c)->Decide(h).alpha, 0.44, 1e-12);
  h.push_back(Window(2, 0.090, 0.3, 0.12));  // near the floor: clipped to 0.1
  EXPECT_NEAR((*c)->Decide(h).alpha, 0.1, 1e-12);
  // An actor of the wrong shape is a clear error.
  DenseLayer wrong{.in = kNumFeatures,
                   .out = 3,
                   .weights = std::vector<float>(21, 0.0f),
                   .bias = std::vector<float>(3, 0.0f)};
  auto small = Mlp::Create(identity, {wrong}, Activation::kTanh);
  ASSERT_TRUE(small.ok());
  auto bad = MakePolicy(std::move(*small));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("7 actions"), std::string::npos) << bad.status();
}

TEST(RecoveryTest, BadOptionsAreRejected) {
  EXPECT_FALSE(MakeRecovery(nullptr).ok());
  EXPECT_FALSE(MakeRecovery(MakeStatic(0.5), {.history = 1}).ok());
  EXPECT_FALSE(MakeRecovery(MakeStatic(0.5), {.max_step = 2}).ok());
  EXPECT_FALSE(
      MakeRecovery(MakeStatic(0.5), {.bounds = {.alpha_min = 0.8, .alpha_max = 0.2}}).ok());
}

}  // namespace
}  // namespace hlem::allocator
