// The optimisation and learned baselines of issue 7 (BO, MILP, XGBoost): their contracts and that
// each finds its way toward α* on a synthetic node, from a bad start and after a shift.

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "allocator_service/core/bayes_opt.h"
#include "allocator_service/core/milp.h"
#include "allocator_service/core/plant_testing.h"
#include "allocator_service/core/xgb_latency.h"
#include "gtest/gtest.h"

namespace hlem::allocator {
namespace {

using testing::PlantWindow;
using testing::Regime;
using testing::RunPlant;

struct Case {
  std::string name;
  std::function<std::unique_ptr<Controller>()> make;
};

std::vector<Case> Baselines() {
  return {{"bo", [] { return *MakeBayesOpt(); }},
          {"milp", [] { return *MakeMilp(); }},
          {"xgboost", [] { return *MakeXgbLatency(); }}};
}

TEST(BaselinesTest, StayInBoundsWithAReasonAndHoldWithoutRequests) {
  for (const Case& c : Baselines()) {
    std::unique_ptr<Controller> ctl = c.make();
    EXPECT_EQ(ctl->name(), c.name);
    std::vector<WindowState> h;
    double alpha = 0.95;  // outside the bounds: the controllers clip
    for (int t = 0; t < 30; ++t) {
      h.push_back(PlantWindow(t, {.alpha_star = 0.05, .hot_ratio = 0.4, .seq_len_norm = 0.7}, alpha,
                              std::sin(t)));
      const Decision d = ctl->Decide(h);
      ctl->Learn();
      EXPECT_GE(d.alpha, 0.1) << c.name;
      EXPECT_LE(d.alpha, 0.9) << c.name;
      EXPECT_FALSE(d.detail.empty()) << c.name;
      EXPECT_TRUE(d.reason == Reason::kBaseline || d.reason == Reason::kHold) << c.name;
      alpha = d.alpha;
    }
    h.back().requests = 0;
    const Decision held = ctl->Decide(h);
    EXPECT_EQ(held.reason, Reason::kHold) << c.name;
    EXPECT_DOUBLE_EQ(held.alpha, std::clamp(h.back().alpha, 0.1, 0.9)) << c.name;
  }
}

TEST(BaselinesTest, EachClosesMostOfAGapAndFollowsAShift) {
  // 40 windows at α* = 0.5 from α = 0.2, then 40 at α* = 0.25 (another workload); the mean gap
  // over the last 10 windows of each phase.
  std::vector<Regime> regimes(40, {.alpha_star = 0.5, .hot_ratio = 0.2, .seq_len_norm = 0.5});
  regimes.resize(80, {.alpha_star = 0.25, .hot_ratio = 0.55, .seq_len_norm = 0.9});
  for (const Case& c : Baselines()) {
    std::unique_ptr<Controller> ctl = c.make();
    const std::vector<double> a = RunPlant(*ctl, regimes, 0.2, 5);
    const double settled = testing::MeanGap(a, 30, 40, 0.5),
                 shifted = testing::MeanGap(a, 70, 80, 0.25);
    std::printf("%s: mean |alpha - alpha*| windows 30-39 %.3f (from 0.30), 70-79 %.3f (from 0.25)",
                c.name.c_str(), settled, shifted);
    for (size_t t = 0; t < a.size(); ++t) std::printf("%s%.2f", t % 20 == 0 ? "\n  " : " ", a[t]);
    std::printf("\n");
    EXPECT_LT(settled, 0.15) << c.name;
    EXPECT_LT(shifted, 0.15) << c.name;
  }
}

TEST(BaselinesTest, Deterministic) {
  std::vector<Regime> regimes(30, {.alpha_star = 0.4, .hot_ratio = 0.3, .seq_len_norm = 0.6});
  for (const Case& c : Baselines()) {
    std::unique_ptr<Controller> a = c.make(), b = c.make();
    EXPECT_EQ(RunPlant(*a, regimes, 0.6, 3), RunPlant(*b, regimes, 0.6, 3)) << c.name;
  }
}

TEST(BaselinesTest, RejectBadOptions) {
  EXPECT_FALSE(MakeBayesOpt({.windows = 1}).ok());
  EXPECT_FALSE(MakeBayesOpt({.noise = 0}).ok());
  EXPECT_FALSE(MakeMilp({.breakpoint_step = 0}).ok());
  EXPECT_FALSE(MakeMilp({.bounds = {.alpha_min = 0.7, .alpha_max = 0.3}}).ok());
  EXPECT_FALSE(MakeXgbLatency({.min_samples = 1}).ok());
  EXPECT_FALSE(MakeXgbLatency({.max_depth = 0}).ok());
}

}  // namespace
}  // namespace hlem::allocator
