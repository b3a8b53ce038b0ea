#include "router/core/retry_budget.h"

#include <cmath>
#include <string>
#include <utility>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace hlem::router {
namespace {

// Retries allowed in a row now, up to `most`.
int Drain(RetryBudget& budget, int most = 10000) {
  int n = 0;
  while (n < most && budget.TryRetry()) ++n;
  return n;
}

TEST(RetryBudgetTest, RetriesStayWithinTheRatioOfTheWindowsRequests) {
  SimClock clock;
  RetryBudget budget({.ratio = 0.5, .min_per_second = 0, .window = absl::Seconds(10)}, clock);
  EXPECT_FALSE(budget.TryRetry());  // no requests, no floor: nothing to spend
  for (int i = 0; i < 100; ++i) budget.OnRequest();
  EXPECT_EQ(Drain(budget), 50);
  // More requests later in the window add to it.
  clock.AdvanceBy(absl::Seconds(5));
  for (int i = 0; i < 20; ++i) budget.OnRequest();
  EXPECT_EQ(Drain(budget), 10);
  // Past the window the first 100 requests and their 50 retries no longer count; the 20 later
  // ones and their 10 retries do, until they leave too.
  clock.AdvanceBy(absl::Seconds(6));
  EXPECT_EQ(Drain(budget), 0);
  for (int i = 0; i < 40; ++i) budget.OnRequest();
  EXPECT_EQ(Drain(budget), 20);  // (20 + 40) / 2 − 10
  clock.AdvanceBy(absl::Seconds(20));
  EXPECT_FALSE(budget.TryRetry());
  const RetryBudgetStats s = budget.Stats();
  EXPECT_EQ(s.requests, 160u);
  EXPECT_EQ(s.retries, 80u);
  EXPECT_EQ(s.over_budget, 6u);  // one refusal per Drain and the two lone tries
}

TEST(RetryBudgetTest, AQuietRouterStillRetriesAtTheFloorRate) {
  SimClock clock(absl::FromUnixSeconds(1'700'000'000));
  RetryBudget budget({.ratio = 0.2, .min_per_second = 2, .window = absl::Seconds(5)}, clock);
  EXPECT_EQ(Drain(budget), 10);  // 2/s over 5 s
  clock.AdvanceBy(absl::Seconds(2));
  EXPECT_EQ(Drain(budget), 0);  // the window still holds them
  clock.AdvanceBy(absl::Seconds(4));
  EXPECT_EQ(Drain(budget), 10);
  for (int i = 0; i < 50; ++i) budget.OnRequest();
  EXPECT_EQ(Drain(budget), 10);  // + 0.2 × 50
}

TEST(RetryBudgetTest, BadOptionsAreNamed) {
  EXPECT_TRUE(RetryBudget::Validate({}).ok());
  for (const auto& [options, field] :
       {std::pair{RetryBudgetOptions{.ratio = -1}, "retry_budget.ratio"},
        std::pair{RetryBudgetOptions{.ratio = std::nan("")}, "retry_budget.ratio"},
        std::pair{RetryBudgetOptions{.min_per_second = -0.5}, "retry_budget.min_per_second"},
        std::pair{RetryBudgetOptions{.window = absl::ZeroDuration()}, "retry_budget.window"}}) {
    const absl::Status st = RetryBudget::Validate(options);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(field), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace hlem::router
