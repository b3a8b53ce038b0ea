#include "serving_node/core/emulated_link.h"

#include <functional>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace hlem::serving {
namespace {

// 1 GB/s and 2 us latency: 1 MiB takes 2 us + 1048.576 us.
constexpr LinkOptions kLink{.bytes_per_second = 1e9, .latency = absl::Microseconds(2)};

TEST(EmulatedLinkTest, RejectsBadOptions) {
  SimClock clock;
  EXPECT_FALSE(EmulatedLink::Create({.bytes_per_second = 0}, clock).ok());
  EXPECT_FALSE(
      EmulatedLink::Create({.bytes_per_second = 1e9, .latency = -absl::Seconds(1)}, clock).ok());
}

TEST(EmulatedLinkTest, TransfersTakeLatencyPlusBytesOverBandwidthOneAtATime) {
  SimClock clock;
  auto link = *EmulatedLink::Create(kLink, clock);
  EXPECT_EQ(link->TransferTime(1000), absl::Microseconds(3));
  std::vector<absl::Time> done;
  const absl::Time t0 = clock.Now();
  link->Submit(CopyClass::kCritical, 1000, [&] { done.push_back(clock.Now()); });
  link->Submit(CopyClass::kCritical, 1000, [&] { done.push_back(clock.Now()); });
  EXPECT_TRUE(link->critical_pending());
  while (clock.RunNext()) {
  }
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0] - t0, absl::Microseconds(3));
  EXPECT_EQ(done[1] - t0, absl::Microseconds(6));  // serialised, not overlapped
  EXPECT_FALSE(link->critical_pending());
  EXPECT_EQ(link->busy_ns(), 6000u);
}

// A clock whose timers run `lateness` after they are due (a busy RealClock's wake-ups).
class LateClock final : public Clock {
 public:
  LateClock(SimClock& inner, absl::Duration lateness) : inner_(inner), lateness_(lateness) {}
  absl::Time Now() const override { return inner_.Now(); }
  TimerId ScheduleAt(absl::Time when, std::function<void()> fn) override {
    return inner_.ScheduleAt(when + lateness_, std::move(fn));
  }
  bool Cancel(TimerId id) override { return inner_.Cancel(id); }
  void SleepUntil(absl::Time when) override { inner_.SleepUntil(when); }

 private:
  SimClock& inner_;
  const absl::Duration lateness_;
};

TEST(EmulatedLinkTest, LateTimersDoNotSlowBackToBackTransfers) {
  SimClock sim;
  LateClock clock(sim, absl::Milliseconds(1));
  // 1 ms per transfer; every completion timer runs 1 ms late.
  auto link =
      *EmulatedLink::Create({.bytes_per_second = 1e6, .latency = absl::ZeroDuration()}, clock);
  std::vector<absl::Duration> done;
  const absl::Time t0 = sim.Now();
  for (int i = 0; i < 10; ++i) {
    link->Submit(CopyClass::kCritical, 1000, [&] { done.push_back(sim.Now() - t0); });
  }
  while (sim.RunNext()) {
  }
  ASSERT_EQ(done.size(), 10u);
  // Transfer k ends at k ms on the link's time line and is reported one wake-up later; the
  // lateness does not add up (it was 2k ms when each transfer started at its predecessor's late
  // completion).
  for (int k = 1; k <= 10; ++k) EXPECT_EQ(done[k - 1], absl::Milliseconds(k + 1)) << k;
  // A transfer submitted after the link went idle starts when it is submitted.
  sim.AdvanceBy(absl::Milliseconds(5));
  const absl::Time t1 = sim.Now();
  link->Submit(CopyClass::kCritical, 1000, [&] { done.push_back(sim.Now() - t1); });
  while (sim.RunNext()) {
  }
  EXPECT_EQ(done.back(), absl::Milliseconds(2));
}

TEST(EmulatedLinkTest, CriticalGoesFirstAndWaitsAtMostOneBackgroundChunk) {
  SimClock clock;
  auto link = *EmulatedLink::Create(kLink, clock);
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<std::string> order;
  const absl::Time t0 = clock.Now();
  for (int i = 0; i < 4; ++i) {
    link->Submit(CopyClass::kBackground, kChunk,
                 [&, i] { order.push_back("bg" + std::to_string(i)); });
  }
  // A miss arrives while the first background chunk is on the link.
  clock.AdvanceBy(absl::Microseconds(100));
  absl::Time critical_done;
  link->Submit(CopyClass::kCritical, 4096, [&] {
    order.push_back("critical");
    critical_done = clock.Now();
  });
  while (clock.RunNext()) {
  }
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order[0], "bg0");
  EXPECT_EQ(order[1], "critical");  // ahead of bg1..bg3
  // Its delay beyond its own transfer time is bounded by one chunk's transfer time.
  absl::Duration delay =
      (critical_done - (t0 + absl::Microseconds(100))) - link->TransferTime(4096);
  EXPECT_LE(delay, link->TransferTime(kChunk));
  EXPECT_GT(delay, absl::ZeroDuration());
}

}  // namespace
}  // namespace hlem::serving
