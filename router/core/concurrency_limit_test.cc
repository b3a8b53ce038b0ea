#include "router/core/concurrency_limit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "gtest/gtest.h"

namespace hlem::router {
namespace {

ConcurrencyLimitOptions Small(uint32_t baseline_samples = 10) {
  return {.min_limit = 2,
          .max_limit = 64,
          .initial_limit = 8,
          .tolerance = 2.0,
          .percentile = 0.9,
          .interval = absl::Milliseconds(100),
          .min_samples = 10,
          .rebaseline_every = absl::Seconds(30),
          .baseline_samples = baseline_samples};
}

// Runs `n` calls one after another, each answered `latency` after it started.
void Serial(ConcurrencyLimit& limit, SimClock& clock, int n, absl::Duration latency) {
  for (int i = 0; i < n; ++i) {
    ConcurrencyLimit::Ticket t;
    ASSERT_TRUE(limit.Acquire(&t));
    clock.AdvanceBy(latency);
    limit.Release(t, LatencySample::kFull);
  }
}

// `n` calls at once, each answered `latency` later; true when all were admitted.
bool Together(ConcurrencyLimit& limit, SimClock& clock, uint32_t n, absl::Duration latency) {
  std::vector<ConcurrencyLimit::Ticket> tickets(n);
  uint32_t got = 0;
  for (auto& t : tickets) got += limit.Acquire(&t) ? 1 : 0;
  clock.AdvanceBy(latency);
  for (uint32_t i = 0; i < got; ++i) limit.Release(tickets[i], LatencySample::kFull);
  return got == n;
}

// Keeps `n` calls in flight, each answered `latency` after it started, for `duration` or until a
// call is refused; returns the calls still in flight. Past its first calls no call starts with
// fewer than n − 1 in flight: the router is busy.
std::deque<ConcurrencyLimit::Ticket> Busy(ConcurrencyLimit& limit, SimClock& clock, uint32_t n,
                                          absl::Duration latency, absl::Duration duration) {
  std::deque<ConcurrencyLimit::Ticket> out;
  const absl::Time end = clock.Now() + duration;
  while (clock.Now() < end) {
    if (out.size() == n) {
      limit.Release(out.front(), LatencySample::kFull);
      out.pop_front();
    }
    ConcurrencyLimit::Ticket t;
    if (!limit.Acquire(&t)) break;
    out.push_back(t);
    clock.AdvanceBy(latency / n);
  }
  return out;
}

void ReleaseAll(ConcurrencyLimit& limit, std::deque<ConcurrencyLimit::Ticket>& calls) {
  for (const ConcurrencyLimit::Ticket& t : calls) limit.Release(t, LatencySample::kFull);
  calls.clear();
}

TEST(ConcurrencyLimitTest, BadOptionsAreNamed) {
  auto field = [](ConcurrencyLimitOptions o) {
    return std::string(ConcurrencyLimit::Validate(o).message());
  };
  EXPECT_TRUE(ConcurrencyLimit::Validate({}).ok());
  ConcurrencyLimitOptions o;
  o.min_limit = 0;
  EXPECT_NE(field(o).find("concurrency_limit.min_limit"), std::string::npos);
  o = {};
  o.max_limit = o.min_limit - 1;
  EXPECT_NE(field(o).find("max_limit"), std::string::npos);
  o = {};
  o.initial_limit = o.max_limit + 1;
  EXPECT_NE(field(o).find("initial_limit"), std::string::npos);
  o = {};
  o.tolerance = 0.5;
  EXPECT_NE(field(o).find("tolerance"), std::string::npos);
  o.tolerance = std::nan("");
  EXPECT_NE(field(o).find("tolerance"), std::string::npos);
  o = {};
  o.percentile = 0;
  EXPECT_NE(field(o).find("percentile"), std::string::npos);
  o = {};
  o.interval = absl::ZeroDuration();
  EXPECT_NE(field(o).find("interval"), std::string::npos);
  o = {};
  o.rebaseline_every = absl::InfiniteDuration();
  EXPECT_NE(field(o).find("rebaseline_every"), std::string::npos);
  o = {};
  o.first_baseline_within = absl::ZeroDuration();
  EXPECT_NE(field(o).find("first_baseline_within"), std::string::npos);
  o = {};
  o.min_samples = 0;
  EXPECT_NE(field(o).find("min_samples"), std::string::npos);
  o = {};
  o.baseline_samples = 0;
  EXPECT_NE(field(o).find("baseline_samples"), std::string::npos);
}

TEST(ConcurrencyLimitTest, TheFirstBaselineIsThePercentileOfUncrowdedAnswers) {
  SimClock clock;
  ConcurrencyLimit limit(Small(), clock);
  EXPECT_FALSE(limit.Stats().measuring_baseline);
  EXPECT_EQ(limit.Stats().limit, 8u);  // initial_limit until there is a baseline
  EXPECT_FALSE(Together(limit, clock, 9, absl::Milliseconds(1)));  // eight admitted, one refused
  EXPECT_EQ(limit.Stats().refused, 1u);
  EXPECT_EQ(limit.Stats().baselines, 0u);  // eight at once: crowded
  // Ten answers one at a time (1 .. 10 ms): the 90th percentile is 9 ms.
  for (int ms = 1; ms <= 10; ++ms) Serial(limit, clock, 1, absl::Milliseconds(ms));
  const ConcurrencyLimitStats s = limit.Stats();
  EXPECT_FALSE(s.measuring_baseline);
  EXPECT_EQ(s.baseline, absl::Milliseconds(9));
  EXPECT_EQ(s.limit, 8u);
  EXPECT_EQ(s.baselines, 1u);
  EXPECT_EQ(s.forced_baselines, 0u);
  EXPECT_EQ(s.updates, 0u);  // the samples before the baseline were judged against nothing
}

TEST(ConcurrencyLimitTest, AnswersThatAreNotSamplesDoNotMakeABaseline) {
  SimClock clock;
  ConcurrencyLimit limit(Small(), clock);
  for (int i = 0; i < 50; ++i) {
    ConcurrencyLimit::Ticket t;
    ASSERT_TRUE(limit.Acquire(&t));
    clock.AdvanceBy(absl::Microseconds(100));
    limit.Release(t, i % 2 ? LatencySample::kNone : LatencySample::kLoad);  // errors, deadlines
  }
  EXPECT_EQ(limit.Stats().baselines, 0u);
  EXPECT_EQ(limit.Stats().in_flight, 0u);
}

TEST(ConcurrencyLimitTest, TheLimitFallsWhileTheLatencyIsOverTheTarget) {
  SimClock clock;
  ConcurrencyLimit limit(Small(), clock);
  Serial(limit, clock, 10, absl::Milliseconds(10));  // baseline 10 ms: target 20 ms
  ASSERT_EQ(limit.Stats().limit, 8u);
  // 8 calls at once answered in 40 ms: twice the target, so the limit halves per interval.
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(Together(limit, clock, 8, absl::Milliseconds(40)));
  clock.AdvanceBy(absl::Milliseconds(30));
  EXPECT_TRUE(Together(limit, clock, 1, absl::Microseconds(1)));  // past the interval: update
  EXPECT_EQ(limit.Stats().limit, 4u);
  EXPECT_EQ(limit.Stats().updates, 1u);
  EXPECT_FALSE(Together(limit, clock, 5, absl::Milliseconds(200)));  // 4 admitted, at 10× target
  EXPECT_TRUE(Together(limit, clock, 4, absl::Milliseconds(200)));
  EXPECT_TRUE(Together(limit, clock, 2, absl::Milliseconds(200)));
  EXPECT_EQ(limit.Stats().limit, 2u);  // never below min_limit
}

TEST(ConcurrencyLimitTest, CallsAdmittedUnderTheOldLimitDoNotJudgeTheNewOne) {
  SimClock clock;
  ConcurrencyLimit limit(Small(), clock);
  Serial(limit, clock, 10, absl::Milliseconds(10));  // baseline 10 ms: target 20 ms
  // Eight in flight at 100 ms: the first update halves the limit, and the next call is refused.
  std::deque<ConcurrencyLimit::Ticket> old =
      Busy(limit, clock, 8, absl::Milliseconds(100), absl::Seconds(1));
  ASSERT_EQ(limit.Stats().limit, 4u);
  clock.AdvanceBy(absl::Milliseconds(60));
  ReleaseAll(limit, old);  // 7 slow answers of calls admitted under the limit of 8
  clock.AdvanceBy(absl::Milliseconds(100));
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Together(limit, clock, 3, absl::Milliseconds(5)));
  // The update judges the 12 fast calls only: it grows the limit back (×2).
  EXPECT_EQ(limit.Stats().limit, 8u);
}

TEST(ConcurrencyLimitTest, SlowAnswersBelowTheLimitDoNotLowerIt) {
  SimClock clock;
  ConcurrencyLimit limit(Small(), clock);
  Serial(limit, clock, 10, absl::Milliseconds(10));
  // Seven at a time (the limit is 8) at 10× the target: a slow spell, not the router's queue.
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(Together(limit, clock, 7, absl::Milliseconds(200)));
  EXPECT_GE(limit.Stats().updates, 10u);
  EXPECT_EQ(limit.Stats().limit, 8u);
  EXPECT_EQ(limit.Stats().refused, 0u);
  // Reaching the limit, the same latency lowers it (halves it: the factor's floor) at the next
  // update.
  const uint64_t updates = limit.Stats().updates;
  for (int i = 0; i < 5 && limit.Stats().updates == updates; ++i) {
    EXPECT_TRUE(Together(limit, clock, 8, absl::Milliseconds(200)));
  }
  EXPECT_EQ(limit.Stats().limit, 4u);
}

TEST(ConcurrencyLimitTest, LoadSamplesLowerTheLimitButMakeNoBaseline) {
  SimClock clock;
  ConcurrencyLimit limit(Small(/*baseline_samples=*/2), clock);
  Serial(limit, clock, 2, absl::Milliseconds(10));
  // Uncrowded calls that ran out of time: no baseline of 1 s.
  for (int i = 0; i < 4; ++i) {
    ConcurrencyLimit::Ticket t;
    ASSERT_TRUE(limit.Acquire(&t));
    clock.AdvanceBy(absl::Seconds(1));
    limit.Release(t, LatencySample::kLoad);
  }
  EXPECT_EQ(limit.Stats().baseline, absl::Milliseconds(10));
  EXPECT_EQ(limit.Stats().baselines, 1u);
  // With the limit reached, they bring it down.
  const uint64_t updates = limit.Stats().updates;
  for (int i = 0; i < 5 && limit.Stats().updates == updates; ++i) {
    std::vector<ConcurrencyLimit::Ticket> tickets(8);
    for (auto& t : tickets) ASSERT_TRUE(limit.Acquire(&t));
    clock.AdvanceBy(absl::Milliseconds(100));
    for (auto& t : tickets) limit.Release(t, LatencySample::kLoad);
  }
  EXPECT_EQ(limit.Stats().limit, 4u);
}

TEST(ConcurrencyLimitTest, TheLimitGrowsOnlyWhereItIsUsed) {
  SimClock clock;
  ConcurrencyLimit limit(Small(), clock);
  Serial(limit, clock, 10, absl::Milliseconds(10));
  // Fast answers, but one call at a time: the limit of 8 is not used, so it stays.
  Serial(limit, clock, 40, absl::Milliseconds(5));
  EXPECT_GE(limit.Stats().updates, 1u);
  EXPECT_EQ(limit.Stats().limit, 8u);
  // Eight at once at 5 ms (the serial calls re-measured the baseline at 5 ms: half the target):
  // it doubles each interval up to max_limit.
  uint32_t last = 8;
  for (int i = 0; i < 200 && limit.Stats().limit < 64; ++i) {
    const uint32_t l = limit.Stats().limit;
    EXPECT_TRUE(Together(limit, clock, l, absl::Milliseconds(5)));
    EXPECT_LE(limit.Stats().limit, std::max(2 * last, last + 1));
    last = limit.Stats().limit;
  }
  EXPECT_EQ(limit.Stats().limit, 64u);
  for (int i = 0; i < 30; ++i) Together(limit, clock, 64, absl::Milliseconds(5));
  EXPECT_EQ(limit.Stats().limit, 64u);  // never above max_limit
}

TEST(ConcurrencyLimitTest, TheBaselineIsTakenFromUncrowdedCallsOnly) {
  SimClock clock;
  ConcurrencyLimit limit(Small(/*baseline_samples=*/2), clock);
  Serial(limit, clock, 2, absl::Milliseconds(10));
  ASSERT_EQ(limit.Stats().baseline, absl::Milliseconds(10));
  // Calls one at a time re-measure it as they come, without a phase at min_limit.
  Serial(limit, clock, 2, absl::Milliseconds(12));
  EXPECT_EQ(limit.Stats().baseline, absl::Milliseconds(12));
  EXPECT_EQ(limit.Stats().baselines, 2u);
  EXPECT_FALSE(limit.Stats().measuring_baseline);
  // Three at once (over min_limit 2) are no baseline samples, and nor is a call that started
  // alone but had company before its answer.
  EXPECT_TRUE(Together(limit, clock, 3, absl::Milliseconds(50)));
  ConcurrencyLimit::Ticket alone, second, third;
  ASSERT_TRUE(limit.Acquire(&alone));
  clock.AdvanceBy(absl::Milliseconds(1));
  ASSERT_TRUE(limit.Acquire(&second));
  ASSERT_TRUE(limit.Acquire(&third));  // the third in flight: crowded
  clock.AdvanceBy(absl::Milliseconds(60));
  for (const auto* t : {&alone, &second, &third}) limit.Release(*t, LatencySample::kFull);
  EXPECT_EQ(limit.Stats().baseline, absl::Milliseconds(12));
  EXPECT_EQ(limit.Stats().baselines, 2u);
  EXPECT_EQ(limit.Stats().refused, 0u);
}

TEST(ConcurrencyLimitTest, WithoutUncrowdedCallsTheBaselineIsMeasuredAtMinLimit) {
  SimClock clock;
  ConcurrencyLimitOptions o = Small(/*baseline_samples=*/2);
  o.rebaseline_every = absl::Seconds(1);
  ConcurrencyLimit limit(o, clock);
  Serial(limit, clock, 2, absl::Milliseconds(10));
  Serial(limit, clock, 1, absl::Milliseconds(100));  // one sample of the next baseline's two
  // Busy: 4 in flight (within the target), never uncrowded. A second after the last call that
  // started uncrowded, the phase begins: the limit is min_limit (2), and the busy calls' next
  // one is refused.
  std::deque<ConcurrencyLimit::Ticket> busy =
      Busy(limit, clock, 4, absl::Milliseconds(15), absl::Seconds(2));
  EXPECT_LT(clock.Now(), absl::UnixEpoch() + absl::Milliseconds(1200));
  EXPECT_TRUE(limit.Stats().measuring_baseline);
  EXPECT_EQ(limit.Stats().forced_baselines, 1u);
  EXPECT_EQ(limit.Stats().baselines, 1u);
  ReleaseAll(limit, busy);  // crowded: no samples of the phase
  EXPECT_TRUE(limit.Stats().measuring_baseline);
  // Fresh samples only (the 100 ms one is dropped).
  ConcurrencyLimit::Ticket a, b, c;
  ASSERT_TRUE(limit.Acquire(&a));
  ASSERT_TRUE(limit.Acquire(&b));
  EXPECT_FALSE(limit.Acquire(&c));
  clock.AdvanceBy(absl::Milliseconds(30));  // the cluster got slower: 30 ms
  limit.Release(a, LatencySample::kFull);
  EXPECT_TRUE(limit.Stats().measuring_baseline);  // one sample of two
  limit.Release(b, LatencySample::kFull);
  const ConcurrencyLimitStats s = limit.Stats();
  EXPECT_FALSE(s.measuring_baseline);
  EXPECT_EQ(s.baseline, absl::Milliseconds(30));
  EXPECT_EQ(s.baselines, 2u);
  // The limit from before the phase: 8 × (20 ms target ÷ 15 ms) once while busy; not again, as
  // 4 in flight are under half of 10.67.
  EXPECT_EQ(s.limit, 10u);
}

TEST(ConcurrencyLimitTest, ARouterStartedIntoOverloadMeasuresItsFirstBaselineWithinASecond) {
  SimClock clock;
  ConcurrencyLimit limit(Small(), clock);  // first_baseline_within 1 s
  // Eight in flight from the start (initial_limit 8): busy, so a second later the phase begins.
  std::deque<ConcurrencyLimit::Ticket> busy =
      Busy(limit, clock, 8, absl::Milliseconds(100), absl::Seconds(5));
  EXPECT_LT(clock.Now(), absl::UnixEpoch() + absl::Milliseconds(1200));
  EXPECT_EQ(limit.Stats().forced_baselines, 1u);
  EXPECT_TRUE(limit.Stats().measuring_baseline);
  EXPECT_EQ(limit.Stats().limit, 2u);
  ReleaseAll(limit, busy);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(Together(limit, clock, 2, absl::Milliseconds(10)));
  EXPECT_EQ(limit.Stats().baselines, 1u);
  EXPECT_EQ(limit.Stats().baseline, absl::Milliseconds(10));
  EXPECT_FALSE(limit.Stats().measuring_baseline);
  EXPECT_EQ(limit.Stats().limit, 8u);
}

TEST(ConcurrencyLimitTest, AnIdleSpellIsNotABusyOne) {
  SimClock clock;
  ConcurrencyLimit limit(Small(), clock);
  clock.AdvanceBy(absl::Seconds(5));  // no call for 5 s after the start (first_baseline_within 1 s)
  EXPECT_TRUE(Together(limit, clock, 8, absl::Milliseconds(10)));  // initial_limit, no phase
  Serial(limit, clock, 10, absl::Milliseconds(10));
  ASSERT_EQ(limit.Stats().baselines, 1u);
  clock.AdvanceBy(absl::Minutes(2));  // idle, past rebaseline_every (30 s)
  EXPECT_TRUE(Together(limit, clock, 8, absl::Milliseconds(10)));
  EXPECT_EQ(limit.Stats().forced_baselines, 0u);
  EXPECT_EQ(limit.Stats().refused, 0u);
}

TEST(ConcurrencyLimitTest, SamplesOfDifferentSpellsMakeNoBaseline) {
  SimClock clock;
  ConcurrencyLimit limit(Small(), clock);  // baseline_samples 10, rebaseline_every 30 s
  Serial(limit, clock, 10, absl::Milliseconds(10));
  ASSERT_EQ(limit.Stats().baseline, absl::Milliseconds(10));
  Serial(limit, clock, 9, absl::Milliseconds(50));  // nine of ten
  clock.AdvanceBy(absl::Seconds(40));
  Serial(limit, clock, 1, absl::Milliseconds(20));  // 40 s later: starts a new set
  EXPECT_EQ(limit.Stats().baseline, absl::Milliseconds(10));
  Serial(limit, clock, 9, absl::Milliseconds(20));
  EXPECT_EQ(limit.Stats().baseline, absl::Milliseconds(20));
}

TEST(ConcurrencyLimitTest, AtLowLoadNothingIsEverRefused) {
  // Calls one at a time (with an occasional pair) for ten minutes: the baseline is re-measured
  // from them, never by a phase at min_limit.
  SimClock clock;
  ConcurrencyLimit limit({}, clock);
  Rng rng(3);
  std::uniform_real_distribution<double> ms(1, 3);
  for (int i = 0; i < 120000; ++i) {
    ConcurrencyLimit::Ticket a, b;
    ASSERT_TRUE(limit.Acquire(&a));
    const bool pair = i % 7 == 0;
    if (pair) {
      ASSERT_TRUE(limit.Acquire(&b));
    }
    clock.AdvanceBy(absl::Seconds(ms(rng) / 1e3));
    limit.Release(a, LatencySample::kFull);
    if (pair) limit.Release(b, LatencySample::kFull);
    clock.AdvanceBy(absl::Milliseconds(3));
  }
  const ConcurrencyLimitStats s = limit.Stats();
  EXPECT_EQ(s.refused, 0u);
  EXPECT_EQ(s.forced_baselines, 0u);  // never held at min_limit after the start
  EXPECT_GT(s.baselines, 100u);
  EXPECT_FALSE(s.measuring_baseline);
}

// A cluster with 4 call slots, each call taking 8–12 ms, offered twice what it can serve
// (Poisson at 800/s for 20 s, its capacity is 400/s): the adaptive limit keeps the admitted
// calls' P99 near tolerance × the unloaded latency and the slots busy; a fixed limit of 64 lets
// them queue at the cluster.
struct Outcome {
  double ok_per_second = 0;
  absl::Duration p99;
};

Outcome Overload(bool adaptive) {
  SimClock clock;
  ConcurrencyLimitOptions o;
  if (!adaptive) o = {.min_limit = 64, .max_limit = 64, .initial_limit = 64};
  ConcurrencyLimit limit(o, clock);
  Rng rng(7);
  std::exponential_distribution<double> gap(800.0);
  std::uniform_real_distribution<double> service(8e-3, 12e-3);
  struct Call {
    ConcurrencyLimit::Ticket ticket;
    absl::Time done;
  };
  auto later = [](const Call& a, const Call& b) { return a.done > b.done; };
  std::priority_queue<Call, std::vector<Call>, decltype(later)> running(later);
  std::deque<ConcurrencyLimit::Ticket> waiting;  // admitted, waiting for a slot
  const absl::Time end = clock.Now() + absl::Seconds(20);
  absl::Time next_arrival = clock.Now();
  std::vector<absl::Duration> latencies;
  auto start_calls = [&] {
    while (running.size() < 4 && !waiting.empty()) {
      running.push({waiting.front(), clock.Now() + absl::Seconds(service(rng))});
      waiting.pop_front();
    }
  };
  while (next_arrival < end || !running.empty()) {
    if (!running.empty() && (running.top().done <= next_arrival || next_arrival >= end)) {
      const Call c = running.top();
      running.pop();
      clock.AdvanceTo(c.done);
      limit.Release(c.ticket, LatencySample::kFull);
      if (c.ticket.start >= absl::UnixEpoch() + absl::Seconds(5)) {  // after the warm-up
        latencies.push_back(clock.Now() - c.ticket.start);
      }
      start_calls();
      continue;
    }
    clock.AdvanceTo(next_arrival);
    next_arrival += absl::Seconds(gap(rng));
    ConcurrencyLimit::Ticket t;
    if (limit.Acquire(&t)) waiting.push_back(t);
    start_calls();
  }
  std::sort(latencies.begin(), latencies.end());
  return {.ok_per_second = static_cast<double>(latencies.size()) / 15.0,
          .p99 = latencies[latencies.size() * 99 / 100]};
}

TEST(ConcurrencyLimitTest, UnderTwiceTheCapacityAdmittedCallsKeepTheirLatency) {
  const Outcome fixed = Overload(false), adaptive = Overload(true);
  // The unloaded latency is 8–12 ms (its 90th percentile ≈ 11.6 ms); tolerance 2.
  EXPECT_LT(adaptive.p99, absl::Milliseconds(40)) << adaptive.p99;
  EXPECT_GT(adaptive.ok_per_second, 0.9 * 400) << adaptive.ok_per_second;
  EXPECT_GT(fixed.p99, absl::Milliseconds(120)) << fixed.p99;  // 64 calls on 4 slots: ≈ 160 ms
  EXPECT_GT(fixed.ok_per_second, 0.9 * 400);
}

}  // namespace
}  // namespace hlem::router
