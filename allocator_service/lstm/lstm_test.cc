#include "allocator_service/lstm/lstm_controller.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "allocator_service/core/plant_testing.h"
#include "allocator_service/core/registry.h"
#include "gtest/gtest.h"

namespace hlem::allocator {
namespace {

using testing::PlantWindow;
using testing::Regime;
using testing::RunPlant;

TEST(LstmTest, AFreshModelHoldsAndItStaysInBounds) {
  absl::StatusOr<std::unique_ptr<Controller>> c = MakeLstm({.dither = 0});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<WindowState> h = {
      PlantWindow(0, {.alpha_star = 0.5, .hot_ratio = 0.2, .seq_len_norm = 0.5}, 0.3, 0)};
  const Decision d = (*c)->Decide(h);
  EXPECT_DOUBLE_EQ(d.alpha, 0.3);  // zero-initialised head: α held
  EXPECT_EQ(d.reason, Reason::kBaseline);
  std::vector<Regime> regimes(40, {.alpha_star = 0.05, .hot_ratio = 0.5, .seq_len_norm = 0.9});
  absl::StatusOr<std::unique_ptr<Controller>> learning = MakeLstm();
  ASSERT_TRUE(learning.ok());
  for (double a : RunPlant(**learning, regimes, 0.5, 3)) {
    EXPECT_GE(a, 0.1);
    EXPECT_LE(a, 0.9);
  }
}

TEST(LstmTest, LearnsTowardAlphaStarAndIsDeterministic) {
  // 40 windows at α* = 0.5 from α = 0.2: the fine-tuned model closes most of the gap.
  std::vector<Regime> regimes(40, {.alpha_star = 0.5, .hot_ratio = 0.2, .seq_len_norm = 0.5});
  std::unique_ptr<Controller> a = *MakeLstm(), b = *MakeLstm();
  const std::vector<double> alphas = RunPlant(*a, regimes, 0.2, 5);
  for (size_t t = 0; t < alphas.size(); ++t)
    std::printf("%s%.2f", t % 20 ? " " : "\n  ", alphas[t]);
  std::printf("\n");
  double gap = 0;
  for (size_t t = 30; t < 40; ++t) gap += std::abs(alphas[t] - 0.5) / 10;
  std::printf("lstm: mean |alpha - alpha*| windows 30-39 %.3f (from 0.30)\n", gap);
  EXPECT_LT(gap, 0.15);
  EXPECT_EQ(alphas, RunPlant(*b, regimes, 0.2, 5));
}

TEST(LstmTest, TheRegistryLoadsThePluginAndRunsItInsideRecovery) {
  absl::StatusOr<ControllerFactory> make = MakeControllerFactory({.name = "lstm"});
  ASSERT_TRUE(make.ok()) << make.status();
  std::unique_ptr<Controller> c = (*make)();
  EXPECT_EQ(c->name(), "lstm+recovery");
  const std::vector<WindowState> h = {
      PlantWindow(0, {.alpha_star = 0.5, .hot_ratio = 0.2, .seq_len_norm = 0.5}, 0.3, 0)};
  EXPECT_NEAR(c->Decide(h).alpha, 0.3, 0.021);  // a fresh model holds (± its dither)
  c->Learn();
  EXPECT_FALSE(
      MakeControllerFactory({.name = "lstm", .bounds = {.alpha_min = 0.9, .alpha_max = 0.1}}).ok());
  EXPECT_FALSE(MakeLstm({.sequence = 0}).ok());
}

}  // namespace
}  // namespace hlem::allocator
