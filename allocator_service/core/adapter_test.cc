#include "allocator_service/core/adapter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "allocator_service/core/plant_testing.h"
#include "gtest/gtest.h"

namespace hlem::allocator {
namespace {

using testing::PlantWindow;
using testing::Regime;
using testing::RunPlant;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // 10-50× slower: the seed sweep is left to release builds
#else
constexpr bool kSanitized = false;
#endif

// A base policy that moves α toward a fixed point by at most 0.06 a window (a PPO policy that
// learned one workload's α and not the shift).
class TowardController final : public Controller {
 public:
  explicit TowardController(double target) : target_(target) {}
  std::string name() const override { return "toward"; }
  Decision Decide(std::span<const WindowState> h) override {
    const double a = h.back().alpha;
    return {.alpha = a + std::clamp(target_ - a, -0.06, 0.06), .reason = Reason::kPolicy};
  }

 private:
  double target_;
};

// An adapter without dither around a base steering to `target`: its α is the base's exactly until
// it has learnt something.
std::unique_ptr<Controller> UnditheredAdapter(double target) {
  AdapterOptions o;
  o.dither = 0;
  absl::StatusOr<std::unique_ptr<Controller>> c =
      MakeAdapter(std::make_unique<TowardController>(target), o);
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(AdapterTest, LearningRateFollowsTheLatencySurprise) {
  AdapterOptions o;
  EXPECT_DOUBLE_EQ(AdapterLearningRate(o, 0.030, 0.030, testing::kPlantSlo),
                   0.0);  // steady: no learning
  EXPECT_NEAR(AdapterLearningRate(o, 0.045, 0.030, testing::kPlantSlo), 1e-3 * 0.5, 1e-15);
  EXPECT_NEAR(AdapterLearningRate(o, 0.015, 0.030, testing::kPlantSlo), 1e-3 * 0.5,
              1e-15);  // either way
  EXPECT_NEAR(AdapterLearningRate(o, 3.0, 0.030, testing::kPlantSlo), 1e-3 * o.eta_cap,
              1e-15);                                              // capped
  EXPECT_DOUBLE_EQ(AdapterLearningRate(o, 0.045, 0.030, 0), 0.0);  // no SLO: nothing to scale by
}

TEST(AdapterTest, FitFindsTheVertexOfAConcaveReward) {
  AdapterOptions o;
  std::vector<WindowState> h;
  const Regime r{.alpha_star = 0.42, .hot_ratio = 0.2, .seq_len_norm = 0.5};
  for (double a : {0.30, 0.36, 0.50, 0.33, 0.45, 0.55}) {
    h.push_back(PlantWindow(h.size(), r, a, 0));
  }
  const std::optional<LocalOptimum> fit = FitLocalOptimum(h, o);
  ASSERT_TRUE(fit.has_value());
  // The reward is not exactly quadratic (the violation fraction is cubic in P99): close, not
  // exact.
  EXPECT_NEAR(fit->alpha, 0.42, 0.03);
  EXPECT_GT(fit->Gain(0.30), 0.0);
  EXPECT_TRUE(fit->WorthMoving(0.30, o));         // noise-free: the gain is far above its error
  EXPECT_FALSE(fit->WorthMoving(fit->alpha, o));  // nothing to gain where it stands
  // All windows at nearly one α: no fit (the adapter dithers instead).
  h.clear();
  for (int i = 0; i < 6; ++i) h.push_back(PlantWindow(i, r, 0.5 + 0.001 * (i % 2), 0));
  EXPECT_FALSE(FitLocalOptimum(h, o).has_value());
  // A monotone reward: the better end, at most `reach` past what was seen.
  h.clear();
  const Regime far{.alpha_star = 0.6, .hot_ratio = 0.2, .seq_len_norm = 0.5};
  for (double a : {0.20, 0.25, 0.30, 0.22}) h.push_back(PlantWindow(h.size(), far, a, 0));
  const std::optional<LocalOptimum> up = FitLocalOptimum(h, o);
  ASSERT_TRUE(up.has_value());
  EXPECT_NEAR(up->alpha, 0.30 + o.reach, 1e-9);
}

TEST(AdapterTest, AFreshAdapterIsTheBasePolicyAndStaysInBounds) {
  std::unique_ptr<Controller> c = UnditheredAdapter(0.5);
  ASSERT_NE(c, nullptr);
  std::vector<WindowState> h = {
      PlantWindow(0, {.alpha_star = 0.5, .hot_ratio = 0.2, .seq_len_norm = 0.5}, 0.3, 0)};
  const Decision d = c->Decide(h);
  EXPECT_DOUBLE_EQ(d.alpha, 0.36);  // the base's step, Δα = 0 (zero-initialised output)
  EXPECT_EQ(d.reason, Reason::kPolicy);
  EXPECT_NE(d.detail.find("adapter"), std::string::npos);
  // Whatever it learns, α stays in the bounds and within max_offset (+ dither) of the base.
  AdapterOptions o;
  absl::StatusOr<std::unique_ptr<Controller>> learning =
      MakeAdapter(std::make_unique<TowardController>(0.9), o);
  ASSERT_TRUE(learning.ok());
  std::vector<Regime> regimes(60, {.alpha_star = 0.1, .hot_ratio = 0.5, .seq_len_norm = 0.9});
  for (double a : RunPlant(**learning, regimes, 0.5, 7)) {
    EXPECT_GE(a, o.bounds.alpha_min);
    EXPECT_LE(a, o.bounds.alpha_max);
  }
}

TEST(AdapterTest, SteadyLatencyLeavesItUntrained) {
  // A plant that answers every α with the same latency: η = 0 every window, Δα stays 0.
  std::unique_ptr<Controller> c = UnditheredAdapter(0.5);
  ASSERT_NE(c, nullptr);
  std::vector<WindowState> h;
  double alpha = 0.2;
  for (int t = 0; t < 20; ++t) {
    WindowState w =
        PlantWindow(t, {.alpha_star = 0.5, .hot_ratio = 0.2, .seq_len_norm = 0.5}, alpha, 0);
    w.p99_seconds = 0.040;
    h.push_back(w);
    const Decision d = c->Decide(h);
    c->Learn();
    EXPECT_DOUBLE_EQ(d.alpha, std::clamp(alpha + std::clamp(0.5 - alpha, -0.06, 0.06), 0.1, 0.9));
    alpha = d.alpha;
  }
}

TEST(AdapterTest, ResumesFromTheAlphaSomeoneElseSetAfterAGap) {
  std::unique_ptr<Controller> c = UnditheredAdapter(0.5);
  ASSERT_NE(c, nullptr);
  const Regime r{.alpha_star = 0.5, .hot_ratio = 0.2, .seq_len_norm = 0.5};
  std::vector<WindowState> h;
  double alpha = 0.5;
  for (uint64_t t = 0; t < 5; ++t) {
    h.push_back(PlantWindow(t, r, alpha, 0));
    alpha = c->Decide(h).alpha;
    c->Learn();
  }
  // Windows 5-8 decided by someone else (the recovery controller), which left α at 0.2.
  for (uint64_t t = 5; t < 9; ++t) h.push_back(PlantWindow(t, r, 0.2, 0));
  h.push_back(PlantWindow(9, r, 0.2, 0));
  EXPECT_NEAR(c->Decide(h).alpha, 0.26, 1e-9);  // the base steps from 0.2, not from 0.5
}

TEST(AdapterTest, TheDeadbandHoldsSmallMovesAndFollowsADriftInJumps) {
  AdapterOptions o;
  o.deadband = 0.1;
  absl::StatusOr<std::unique_ptr<Controller>> c =
      MakeAdapter(std::make_unique<TowardController>(0.9), o);
  ASSERT_TRUE(c.ok()) << c.status();
  const Regime r{.alpha_star = 0.5, .hot_ratio = 0.2, .seq_len_norm = 0.5};
  // Steady latency whatever α (η = 0): the offset stays 0 and the base alone steers.
  const auto window = [&r](uint64_t t, double alpha) {
    WindowState w = PlantWindow(t, r, alpha, 0);
    w.p99_seconds = 0.040;
    return w;
  };
  std::vector<WindowState> h;
  std::vector<double> applied;
  double alpha = 0.5;
  for (uint64_t t = 0; t < 12; ++t) {
    h.push_back(window(t, alpha));
    const Decision d = (*c)->Decide(h);
    (*c)->Learn();
    EXPECT_EQ(d.reason, d.alpha == alpha ? Reason::kHold : Reason::kPolicy) << t;
    alpha = d.alpha;
    applied.push_back(alpha);
  }
  // The base steps 0.56, 0.62, ... 0.90 on its own; the node follows in jumps of >= 0.1 and stays
  // put within 0.1 of the base's fixed point (no dither).
  const std::vector<double> want = {0.5,  0.62, 0.62, 0.74, 0.74, 0.86,
                                    0.86, 0.86, 0.86, 0.86, 0.86, 0.86};
  ASSERT_EQ(applied.size(), want.size());
  for (size_t t = 0; t < want.size(); ++t) EXPECT_NEAR(applied[t], want[t], 1e-9) << t;
  // It holds the α it set, not a window's stale one (a window that closed before the push took).
  h.push_back(window(12, 0.74));
  EXPECT_NEAR((*c)->Decide(h).alpha, 0.86, 1e-9);
}

TEST(AdapterTest, RejectsBadOptions) {
  EXPECT_FALSE(MakeAdapter(nullptr).ok());
  AdapterOptions o;
  o.fit_windows = 2;
  EXPECT_FALSE(MakeAdapter(std::make_unique<TowardController>(0.5), o).ok());
  o = {};
  o.max_offset = -0.1;
  EXPECT_FALSE(MakeAdapter(std::make_unique<TowardController>(0.5), o).ok());
  o = {};
  o.fit_decay = 0;
  EXPECT_FALSE(MakeAdapter(std::make_unique<TowardController>(0.5), o).ok());
  o = {};
  o.deadband = 1.5;
  EXPECT_FALSE(MakeAdapter(std::make_unique<TowardController>(0.5), o).ok());
}

// The gap cut of the adapter on `base` after a shift: α* 0.5 → 0.22 (hot-user ratio 0.2 → 0.55,
// sequences 0.5 → 0.9 of the maximum) after 30 windows; mean |α − α*| over the 12 windows after
// the shift, base alone vs base + adapter, on one noise seed. Returns 1 − gap(adapter) ÷ gap(base).
double GapCut(const std::function<std::unique_ptr<Controller>()>& base, uint64_t seed, bool print) {
  const Regime before{.alpha_star = 0.5, .hot_ratio = 0.2, .seq_len_norm = 0.5};
  const Regime after{.alpha_star = 0.22, .hot_ratio = 0.55, .seq_len_norm = 0.9};
  std::vector<Regime> regimes(30, before);
  regimes.resize(42, after);
  std::unique_ptr<Controller> only = base();
  absl::StatusOr<std::unique_ptr<Controller>> smart = MakeAdapter(base());
  if (only == nullptr || !smart.ok()) return 0;
  const std::vector<double> a_only = RunPlant(*only, regimes, 0.5, seed);
  const std::vector<double> a_smart = RunPlant(**smart, regimes, 0.5, seed);
  const double gap_only = testing::MeanGap(a_only, 30, 42, after.alpha_star);
  const double gap_smart = testing::MeanGap(a_smart, 30, 42, after.alpha_star);
  if (print) {
    std::printf(
        "seed %lu: mean |alpha - alpha*| over the 12 windows after the shift: base %.3f, "
        "+adapter %.3f\n",
        static_cast<unsigned long>(seed), gap_only, gap_smart);
    for (size_t t = 28; t < 42; ++t) {
      std::printf("  window %2zu alpha* %.2f  base %.3f  +adapter %.3f\n", t, regimes[t].alpha_star,
                  a_only[t], a_smart[t]);
    }
  }
  return 1 - gap_smart / gap_only;
}

// The check: after a workload shift the base policy was not trained on, the adapter cuts
// the base policy's mean |α − α*| over the following 12 windows by at least 25 % — on the fixed
// seed 11, and in the median of seeds 1–10 (so that seed 11 is not a lucky pick).
void ExpectAdapterCutsTheGap(const std::function<std::unique_ptr<Controller>()>& base,
                             const char* what) {
  const double cut = GapCut(base, 11, /*print=*/true);
  EXPECT_GE(cut, 0.25) << what;
  if (kSanitized) return;  // the seed sweep checks a statistic, not memory: release builds run it
  std::vector<double> cuts;
  for (uint64_t seed = 1; seed <= 10; ++seed) cuts.push_back(GapCut(base, seed, false));
  std::sort(cuts.begin(), cuts.end());
  const double median = (cuts[4] + cuts[5]) / 2;
  std::printf(
      "%s: gap cut %.1f %% on seed 11; seeds 1-10: min %.1f %%, median %.1f %%, max %.1f %%\n",
      what, 100 * cut, 100 * cuts.front(), 100 * median, 100 * cuts.back());
  EXPECT_GE(median, 0.25) << what;
}

TEST(AdapterTest, CutsTheGapOfABiasedBaseAfterAShift) {
  ExpectAdapterCutsTheGap([] { return std::make_unique<TowardController>(0.5); }, "toward(0.5)");
}

TEST(AdapterTest, CutsTheGapOfTheCommittedPpoPolicyAfterAShift) {
  absl::StatusOr<Mlp> actor =
      LoadActor(std::string(HLEM_SOURCE_DIR) + "/allocator_service/policies/ppo-local.mlp");
  ASSERT_TRUE(actor.ok()) << actor.status();
  ExpectAdapterCutsTheGap(
      [&] {
        absl::StatusOr<std::unique_ptr<Controller>> p = MakePolicy(*actor);
        return p.ok() ? std::move(*p) : nullptr;
      },
      "ppo-local");
}

}  // namespace
}  // namespace hlem::allocator
