#include "sim/twin/twin.h"
#include "sim/twin/train.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sim/twin/control.h"
#include "sim/twin/fit.h"
#include "sim/twin/oracle.h"
#include "sim/twin/shared_compute.h"
#include "sim/twin/sim_device.h"
#include "sim/twin/train.h"
#include "sim/twin/twin_testing.h"
#include "sim/workload/workload_testing.h"

namespace hlem::sim {
namespace {

using testing::Feed;
using testing::Generate;

// The nodes' EMB miss copies carry every fetched row once (TinyTwin's 64-dim fp32 rows), and
// their caches are consistent.
void ExpectEveryFetchedRowCrossesTheLinkOnce(Twin& twin, uint64_t misses) {
  uint64_t miss_bytes = 0;
  for (size_t n = 0; n < twin.num_nodes(); ++n) {
    miss_bytes +=
        twin.node(n).device->stats().bytes[static_cast<int>(serving::CopyPurpose::kEmbMiss)];
    EXPECT_TRUE(twin.node(n).emb->CheckInvariants().ok());
  }
  EXPECT_EQ(miss_bytes, misses * 64 * 4) << "every fetched row crosses the link once";
}

std::unique_ptr<Twin> RunTwin(const TwinOptions& options, const WorkloadConfig& workload,
                              const std::vector<TraceRequest>& trace) {
  auto twin = Twin::Create(options, workload);
  EXPECT_TRUE(twin.ok()) << twin.status();
  const absl::Status st = (*twin)->Run(Feed(trace));
  EXPECT_TRUE(st.ok()) << st;
  return std::move(*twin);
}

TEST(SharedComputeTest, ProcessorSharing) {
  SimClock clock;
  const absl::Time t0 = clock.Now();
  SharedCompute one(clock, 1);
  std::vector<absl::Duration> done;
  one.Run(absl::Milliseconds(10), [&] { done.push_back(clock.Now() - t0); });
  one.Run(absl::Milliseconds(10), [&] { done.push_back(clock.Now() - t0); });
  clock.AdvanceBy(absl::Seconds(1));
  // Two equal jobs share one unit: both finish at 20 ms, in submission order.
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0], absl::Milliseconds(20));
  EXPECT_EQ(done[1], absl::Milliseconds(20));

  // Two units: each runs at full speed; a third job slows all three to 2/3.
  SharedCompute two(clock, 2);
  const absl::Time t1 = clock.Now();
  done.clear();
  two.Run(absl::Milliseconds(10), [&] { done.push_back(clock.Now() - t1); });
  two.Run(absl::Milliseconds(10), [&] { done.push_back(clock.Now() - t1); });
  clock.AdvanceBy(absl::Milliseconds(4));
  two.Run(absl::Milliseconds(1), [&] { done.push_back(clock.Now() - t1); });
  clock.AdvanceBy(absl::Seconds(1));
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0], absl::Microseconds(5500));   // the third: 4 ms + 1 ms of work at 2/3
  EXPECT_EQ(done[1], absl::Microseconds(10500));  // 1 ms at 2/3 (5.5 ms), then 5 ms alone
  EXPECT_EQ(done[2], absl::Microseconds(10500));
  EXPECT_NEAR(absl::ToDoubleMilliseconds(two.busy()), 21, 1e-6);
}

TEST(SimDeviceTest, CriticalCopiesGoFirst) {
  SimClock clock;
  const absl::Time t0 = clock.Now();
  auto device =
      SimDevice::Create(1 << 20, {.bytes_per_second = 1e6, .latency = absl::ZeroDuration()}, clock);
  ASSERT_TRUE(device.ok());
  std::vector<std::pair<int, absl::Duration>> done;
  auto copy = [&](serving::CopyClass cls, int tag) {
    (*device)->CopyToPool(cls, serving::CopyPurpose::kEmbMiss, nullptr, 0, 1000,
                          [&, tag](absl::Status st) {
                            EXPECT_TRUE(st.ok());
                            done.push_back({tag, clock.Now() - t0});
                          });
  };
  copy(serving::CopyClass::kBackground, 1);  // on the link at once
  copy(serving::CopyClass::kBackground, 2);
  copy(serving::CopyClass::kCritical, 3);  // overtakes the waiting background copy
  EXPECT_TRUE((*device)->critical_pending());
  clock.AdvanceBy(absl::Seconds(1));
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0], (std::pair<int, absl::Duration>{1, absl::Milliseconds(1)}));
  EXPECT_EQ(done[1], (std::pair<int, absl::Duration>{3, absl::Milliseconds(2)}));
  EXPECT_EQ(done[2], (std::pair<int, absl::Duration>{2, absl::Milliseconds(3)}));
  EXPECT_EQ((*device)->stats().link_busy_ns, 3'000'000u);
  // Out of the pool: an error, no copy.
  absl::Status bad;
  (*device)->CopyToPool(serving::CopyClass::kCritical, serving::CopyPurpose::kEmbMiss, nullptr,
                        (1 << 20) - 10, 100, [&](absl::Status st) { bad = st; });
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
}

TEST(TwinTest, RegeneratedEventsAreTheTraceEvents) {
  const WorkloadConfig config = testing::TinyWorkload();
  auto generator = WorkloadGenerator::Create(config);
  ASSERT_TRUE(generator.ok());
  const size_t F = config.features.size();
  size_t checked = 0;
  for (const TraceRequest& r : Generate(config)) {
    std::vector<uint64_t> ids;
    for (uint64_t j = 0; j < r.new_events.size() / F; ++j) {
      (*generator)->AppendEventOf(r.user, r.prior_events + j, &ids);
    }
    ASSERT_EQ(ids, r.new_events) << "user " << r.user;
    ++checked;
  }
  EXPECT_GT(checked, 400u);
}

TEST(TwinTest, EveryRequestIsAnsweredAndReturningUsersReuseTheirKv) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  std::unique_ptr<Twin> twin = RunTwin(testing::TinyTwin(workload), workload, trace);
  ASSERT_EQ(twin->outcomes().size(), trace.size());
  uint64_t ok = 0, reused = 0, returning = 0;
  for (const TwinOutcome& o : twin->outcomes()) {
    ok += o.code == absl::StatusCode::kOk;
    EXPECT_GE(o.node, 0);
    EXPECT_GT(o.latency_ns, 0u);
    if (trace[o.index].prior_events > 0) {
      ++returning;
      reused += o.cached_prefix_tokens > 0;
    }
  }
  EXPECT_EQ(ok, trace.size());
  ASSERT_GT(returning, 50u);
  EXPECT_GT(reused, returning / 4) << "returning users should find their K/V";
  // The nodes saw every request and their memory is consistent.
  uint64_t lookups = 0;
  for (size_t n = 0; n < twin->num_nodes(); ++n) {
    lookups += twin->node(n).kv->Stats().lookups;
    EXPECT_TRUE(twin->node(n).pool->CheckInvariants().ok());
    EXPECT_TRUE(twin->node(n).kv->CheckInvariants().ok());
    EXPECT_TRUE(twin->node(n).emb->CheckInvariants().ok());
  }
  EXPECT_EQ(lookups, trace.size());
  EXPECT_GT(twin->stats().simulated, absl::Seconds(4));
}

TEST(TwinTest, AnsweredBeforeIgnoresRequestsSentLater) {
  // The oracle's children wait on this with later requests still in flight: it must look only
  // at the requests sent before t (a regression: unanswered entries once read as sent at 0).
  const WorkloadConfig workload = testing::TinyWorkload();  // 5 s at 100 requests/s
  const std::vector<TraceRequest> trace = Generate(workload);
  auto twin = Twin::Create(testing::TinyTwin(workload), workload);
  ASSERT_TRUE(twin.ok()) << twin.status();
  ASSERT_TRUE((*twin)->Start(Feed(trace)).ok());
  (*twin)->RunUntil(absl::Seconds(3));
  size_t in_flight_later = 0, unanswered_before = 0;
  for (const TwinOutcome& o : (*twin)->outcomes()) {
    if (o.answered) continue;
    (o.sent_ns < 2'000'000'000 ? unanswered_before : in_flight_later) += 1;
  }
  EXPECT_EQ(unanswered_before, 0u);  // 1 s is plenty at this load
  EXPECT_GT(in_flight_later, 0u);    // the request read ahead, at least
  EXPECT_TRUE((*twin)->AnsweredBefore(absl::Seconds(2)));
  EXPECT_FALSE((*twin)->AnsweredBefore(absl::Seconds(4)));  // not sent yet
  EXPECT_TRUE((*twin)->Finish().ok());
}

TEST(TwinTest, SameSeedSameLogHashOtherAlphaOtherResult) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  TwinOptions options = testing::TinyTwin(workload);
  const uint64_t a = RunTwin(options, workload, trace)->stats().log_hash;
  const uint64_t b = RunTwin(options, workload, trace)->stats().log_hash;
  EXPECT_EQ(a, b);
  options.alpha = 0.9;
  const uint64_t c = RunTwin(options, workload, trace)->stats().log_hash;
  EXPECT_NE(a, c);
}

TEST(TwinTest, DeadlinesAreKeptByTheClientAndSaveTheNodesWork) {
  // One node serving one request at a time, 20 ms each, at 100 requests/s: its queue grows far
  // past a 50 ms deadline.
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  TwinOptions options = testing::TinyTwin(workload);
  options.nodes = 1;
  options.node.local.queue.max_batch = 1;
  options.node.local.queue.max_queue = 100'000;
  options.costs.step_overhead = absl::Milliseconds(20);
  options.deadline = absl::Milliseconds(50);
  const auto deadline_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(options.deadline));
  std::unique_ptr<Twin> tight = RunTwin(options, workload, trace);
  ASSERT_EQ(tight->outcomes().size(), trace.size());
  uint64_t ok = 0, expired = 0;
  for (const TwinOutcome& o : tight->outcomes()) {
    ASSERT_TRUE(o.answered) << o.index;
    if (o.code == absl::StatusCode::kDeadlineExceeded) {
      ++expired;
      EXPECT_EQ(o.latency_ns, deadline_ns) << "the client's deadline, not the node's answer";
    } else {
      EXPECT_EQ(o.code, absl::StatusCode::kOk) << o.message;
      ++ok;
      EXPECT_LT(o.latency_ns, deadline_ns);
    }
  }
  EXPECT_GT(expired, trace.size() / 4) << "the node should be far behind";
  // The node does not spend its time on what expired while it waited (the queue's and the
  // pipeline's checks): it serves requests that can still make it. Served oldest first instead
  // (the checks removed), 2 of the 487 are in time; with them, 44.
  EXPECT_GT(ok, trace.size() / 20);
  // With a deadline it cannot reach, it serves every request.
  options.deadline = absl::Hours(1);
  std::unique_ptr<Twin> loose = RunTwin(options, workload, trace);
  for (const TwinOutcome& o : loose->outcomes()) EXPECT_EQ(o.code, absl::StatusCode::kOk);
  EXPECT_EQ(loose->node(0).kv->Stats().lookups, trace.size());
}

TEST(OracleTest, AlphaStarIsTheBestForkAndTheParentReproducesIt) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  auto twin = Twin::Create(testing::TinyTwin(workload), workload);
  ASSERT_TRUE(twin.ok());
  ASSERT_TRUE((*twin)->Start(Feed(trace)).ok());
  const OracleOptions o{.window = absl::Seconds(1),
                        .slo = absl::Milliseconds(25),
                        .coarse_step = 0.25,
                        .fine_step = 0.125,
                        .finest_step = 0.125};
  auto windows = WindowAlphaStar(**twin, o, [](uint64_t, double star) { return star; });
  ASSERT_TRUE(windows.ok()) << windows.status();
  ASSERT_TRUE((*twin)->Finish().ok());
  ASSERT_GE(windows->size(), 5u);
  for (const WindowOracle& w : *windows) {
    ASSERT_GE(w.curve.size(), 5u);  // the coarse grid 0, 0.25, ..., 1
    double top = -1e300;
    for (const CurvePoint& p : w.curve) top = std::max(top, p.reward);
    for (const CurvePoint& p : w.curve) {
      // α* has the best reward, or one within the tie and the lowest P99 among those.
      EXPECT_GE(w.reward_star, top - kRewardTie) << "window " << w.window;
      if (p.reward >= top - kRewardTie) {
        EXPECT_LE(w.p99_star_ms, p.p99_ms) << "window " << w.window << " α " << p.alpha;
      }
    }
    EXPECT_EQ(w.alpha_followed, w.alpha_star);
    // The parent ran the window at alpha*: the same requests, the same state, the same reward as
    // the child that evaluated alpha* (a snapshot is exact).
    const absl::Duration from = o.window * static_cast<int64_t>(w.window);
    EXPECT_DOUBLE_EQ(WindowReward((*twin)->outcomes(), from, from + o.window, o.slo), w.reward_star)
        << "window " << w.window;
  }
}

// A controller that alternates between two αs window by window (on each node).
class Alternating : public allocator::Controller {
 public:
  std::string name() const override { return "alternating"; }
  allocator::Decision Decide(std::span<const allocator::WindowState> history) override {
    return {.alpha = history.back().index % 2 == 0 ? 0.75 : 0.25};
  }
};

TEST(OracleTest, TrackingSearchesFromTheControllersStateAndMeasuresTheirGap) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  auto twin = Twin::Create(testing::TinyTwin(workload), workload);
  ASSERT_TRUE(twin.ok());
  const ControlOptions control{.window = absl::Seconds(1)};
  const OracleOptions o{.window = absl::Seconds(1),
                        .slo = absl::Milliseconds(25),
                        .coarse_step = 0.25,
                        .fine_step = 0.125,
                        .finest_step = 0.125};
  auto tracked = TrackControlled(
      **twin, Feed(trace), [] { return std::make_unique<Alternating>(); }, control, o);
  ASSERT_TRUE(tracked.ok()) << tracked.status();
  ASSERT_GE(tracked->windows.size(), 3u);
  EXPECT_EQ(tracked->decisions.size() % (*twin)->num_nodes(), 0u);
  for (const TrackedWindow& w : tracked->windows) {
    // Window t runs with the decision on window t − 1.
    const double alpha = (w.window - 1) % 2 == 0 ? 0.75 : 0.25;
    ASSERT_EQ(w.alphas.size(), (*twin)->num_nodes());
    for (double a : w.alphas) EXPECT_EQ(a, alpha) << "window " << w.window;
    EXPECT_NEAR(w.gap, std::abs(alpha - w.alpha_star), 1e-12);
    EXPECT_GT(w.requests, 0u);
    // The oracle's child at the controllers' α saw the same state and requests as the parent.
    EXPECT_GE(w.reward_star, w.reward - kRewardTie);
    size_t seen = 0;
    for (const CurvePoint& p : w.curve) {
      if (p.alpha != alpha) continue;
      ++seen;
      EXPECT_DOUBLE_EQ(p.reward, w.reward) << "window " << w.window;
    }
    EXPECT_EQ(seen, 1u) << "window " << w.window;
  }
  // Searching every 2nd window: the same decisions, α* only at the even windows.
  {
    auto sparse = Twin::Create(testing::TinyTwin(workload), workload);
    ASSERT_TRUE(sparse.ok());
    OracleOptions every2 = o;
    every2.search_every = 2;
    auto t2 = TrackControlled(
        **sparse, Feed(trace), [] { return std::make_unique<Alternating>(); }, control, every2);
    ASSERT_TRUE(t2.ok()) << t2.status();
    EXPECT_EQ(t2->decisions.size(), tracked->decisions.size());
    ASSERT_FALSE(t2->windows.empty());
    for (const TrackedWindow& w : t2->windows) {
      EXPECT_EQ(w.window % 2, 0u);
      const auto same = std::find_if(tracked->windows.begin(), tracked->windows.end(),
                                     [&](const TrackedWindow& v) { return v.window == w.window; });
      ASSERT_NE(same, tracked->windows.end());
      EXPECT_EQ(same->alpha_star, w.alpha_star);  // the twin is deterministic
      EXPECT_EQ(same->reward, w.reward);
    }
  }
  // Invalid oracle options are refused before anything runs.
  auto again = Twin::Create(testing::TinyTwin(workload), workload);
  ASSERT_TRUE(again.ok());
  OracleOptions bad = o;
  bad.coarse_step = 0;
  EXPECT_EQ(TrackControlled(
                **again, [](TraceRequest*) { return false; },
                [] { return std::make_unique<Alternating>(); }, control, bad)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Alternating's αs until window `until`, then 0.5 on every node.
class AlternatingUntil : public allocator::Controller {
 public:
  explicit AlternatingUntil(uint64_t until) : until_(until) {}
  std::string name() const override { return "alternating-until"; }
  allocator::Decision Decide(std::span<const allocator::WindowState> history) override {
    const uint64_t w = history.back().index;
    return {.alpha = w >= until_ ? 0.5 : w % 2 == 0 ? 0.75 : 0.25};
  }

 private:
  uint64_t until_;
};

// A SearchCache in memory that counts what it was asked.
class CountingCache : public SearchCache {
 public:
  std::optional<WindowOracle> Find(const std::string& key) override {
    auto it = searches_.find(key);
    if (it == searches_.end()) {
      ++misses;
      return std::nullopt;
    }
    ++hits;
    // Through the text form, as a file-backed cache keeps it.
    absl::StatusOr<WindowOracle> w = ParseWindowOracle(it->second);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::optional<WindowOracle>(*w) : std::nullopt;
  }
  void Store(const std::string& key, const WindowOracle& found) override {
    searches_[key] = FormatWindowOracle(found);
  }
  int hits = 0, misses = 0;

 private:
  std::map<std::string, std::string> searches_;
};

void ExpectSameTracking(const Tracked& a, const Tracked& b) {
  ASSERT_EQ(a.windows.size(), b.windows.size());
  for (size_t i = 0; i < a.windows.size(); ++i) {
    const TrackedWindow &x = a.windows[i], &y = b.windows[i];
    EXPECT_EQ(x.window, y.window);
    EXPECT_EQ(x.alpha_star, y.alpha_star) << "window " << x.window;
    EXPECT_EQ(x.reward_star, y.reward_star) << "window " << x.window;
    EXPECT_EQ(x.p99_star_ms, y.p99_star_ms) << "window " << x.window;
    EXPECT_EQ(x.alphas, y.alphas) << "window " << x.window;
    EXPECT_EQ(x.reward, y.reward) << "window " << x.window;
    EXPECT_EQ(x.p99_ms, y.p99_ms) << "window " << x.window;
    ASSERT_EQ(x.curve.size(), y.curve.size()) << "window " << x.window;
    for (size_t j = 0; j < x.curve.size(); ++j) {
      EXPECT_EQ(x.curve[j].alpha, y.curve[j].alpha);
      EXPECT_EQ(x.curve[j].reward, y.curve[j].reward);
      EXPECT_EQ(x.curve[j].p99_ms, y.curve[j].p99_ms);
    }
  }
  ASSERT_EQ(a.decisions.size(), b.decisions.size());
  for (size_t i = 0; i < a.decisions.size(); ++i)
    EXPECT_EQ(a.decisions[i].alpha, b.decisions[i].alpha);
}

TEST(OracleTest, SearchesAreReusedOnlyWhereTheAlphasAppliedSoFarAgree) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  const ControlOptions control{.window = absl::Seconds(1)};
  OracleOptions o{.window = absl::Seconds(1),
                  .slo = absl::Milliseconds(25),
                  .coarse_step = 0.25,
                  .fine_step = 0.125,
                  .finest_step = 0.125};
  auto track = [&](uint64_t until, const OracleOptions& options) -> absl::StatusOr<Tracked> {
    auto twin = Twin::Create(testing::TinyTwin(workload), workload);
    if (!twin.ok()) return twin.status();
    return TrackControlled(
        **twin, Feed(trace), [until] { return std::make_unique<AlternatingUntil>(until); }, control,
        options);
  };
  constexpr uint64_t kAlways = 1000, kDiverge = 2;
  // Without a cache: what every cached run must reproduce exactly.
  auto plain = track(kAlways, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto plain_diverging = track(kDiverge, o);
  ASSERT_TRUE(plain_diverging.ok()) << plain_diverging.status();
  ASSERT_GE(plain->windows.size(), 4u);

  auto cache = std::make_shared<CountingCache>();
  o.cache = cache;
  o.cache_key = "tiny";
  auto first = track(kAlways, o);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(cache->hits, 0);
  const int searches = cache->misses;
  EXPECT_GE(searches, static_cast<int>(plain->windows.size()));
  ExpectSameTracking(*plain, *first);

  // The same controller again: every search is found, and nothing changes.
  auto again = track(kAlways, o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(cache->hits, searches);
  EXPECT_EQ(cache->misses, searches);
  ExpectSameTracking(*plain, *again);

  // A controller that agrees until its decision on window 2 (applied from window 3): the searches
  // of windows 1–3 are found (their αs so far are the same), the later ones are searched anew.
  cache->hits = cache->misses = 0;
  auto diverging = track(kDiverge, o);
  ASSERT_TRUE(diverging.ok()) << diverging.status();
  EXPECT_EQ(cache->hits, 3);
  EXPECT_EQ(cache->misses, searches - 3);
  ExpectSameTracking(*plain_diverging, *diverging);

  // Other inputs (another cache_key): nothing is found.
  cache->hits = cache->misses = 0;
  o.cache_key = "another trace";
  ASSERT_TRUE(track(kAlways, o).ok());
  EXPECT_EQ(cache->hits, 0);
}

TEST(OracleTest, SearchedWindowsRoundTripThroughTextExactly) {
  WindowOracle w{.window = 7,
                 .alpha_star = 0.3,
                 .reward_star = 1.0 / 3.0,
                 .p99_star_ms = 12.345678901234,
                 .alpha_followed = 0.29,
                 .unimodal = false};
  w.curve = {{0.1, -0.5, std::numeric_limits<double>::infinity()},
             {0.3, 1.0 / 3.0, 12.345678901234}};
  absl::StatusOr<WindowOracle> back = ParseWindowOracle(FormatWindowOracle(w));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->window, 7u);
  EXPECT_EQ(back->alpha_star, w.alpha_star);
  EXPECT_EQ(back->reward_star, w.reward_star);
  EXPECT_EQ(back->p99_star_ms, w.p99_star_ms);
  EXPECT_EQ(back->alpha_followed, w.alpha_followed);
  EXPECT_FALSE(back->unimodal);
  ASSERT_EQ(back->curve.size(), 2u);
  EXPECT_TRUE(std::isinf(back->curve[0].p99_ms));
  EXPECT_EQ(back->curve[1].reward, w.curve[1].reward);
  for (const char* bad :
       {"", "1 2 3", "1 0x1p-1 0 0 0 1 1 0x1p-2 0", "1 0 0 0 0 1 0 extra", "1 0 0 0 0 1 1 0 x 0",
        "-1 0 0 0 0 1 0", "1 0 0 0 0 1 1e300", "1 0 0 0 0 1 0.5 0 0 0", "1.5 0 0 0 0 1 0"}) {
    EXPECT_EQ(ParseWindowOracle(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// What the fit calls: replays the trace in the twin under the given costs.
std::function<absl::StatusOr<SimulatedRun>(const CostModel&)> Replayer(
    const TwinOptions& options, const WorkloadConfig& workload,
    const std::vector<TraceRequest>& trace) {
  return [=](const CostModel& costs) -> absl::StatusOr<SimulatedRun> {
    TwinOptions o = options;
    o.costs = costs;
    std::unique_ptr<Twin> twin = RunTwin(o, workload, trace);
    return SimulatedRun{.outcomes = twin->outcomes(), .stats = twin->stats()};
  };
}

// The fit recovers a twin's own costs from its outcomes: the "real" run is the twin under
// costs whose stages are each scaled by a different factor, the fit starts from the unscaled
// costs and must find the scaled ones (each stage's coefficients move together, so the answer
// is exact up to the tolerance).
TEST(FitTest, RecoversTheCostsARunWasMadeWith) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  const TwinOptions options = testing::TinyTwin(workload);
  const auto simulate = Replayer(options, workload, trace);
  const CostModel start = options.costs;
  CostModel truth = start;
  truth.router_overhead += absl::Microseconds(600);
  truth.step_overhead *= 1.4;
  truth.flops_per_second /= 1.4;
  truth.request_overhead *= 2.0;
  truth.lookup_per_row *= 2.0;
  truth.fetch_overhead *= 1.7;
  truth.fetch_per_row *= 1.7;
  truth.background_cpu = absl::Microseconds(800);
  const uint64_t warmup = 1'000'000'000;
  const absl::StatusOr<SimulatedRun> truth_run = simulate(truth);
  const StageMedians real = MedianStages(truth_run->outcomes, warmup);
  ASSERT_GT(real.requests, 200u);
  ASSERT_GT(real.fetch_ms, 0);
  const TwinStats& s = truth_run->stats;
  const double cpu_per_request =
      absl::ToDoubleSeconds(s.node_cpu + s.background) / static_cast<double>(s.requests);
  absl::StatusOr<FitResult> fit =
      FitCosts(start, truth_run->outcomes, warmup, simulate,
               {.max_iterations = 12, .real_cpu_per_request = cpu_per_request});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_TRUE(fit->converged) << fit->iterations.back().max_error;
  EXPECT_GT(fit->iterations.front().max_error, 0.2);  // the start was far off
  auto near = [](double got, double want) { return std::abs(got - want) <= 0.05 * want; };
  EXPECT_TRUE(near(fit->costs.flops_per_second, truth.flops_per_second))
      << fit->costs.flops_per_second;
  EXPECT_TRUE(near(absl::ToDoubleMicroseconds(fit->costs.request_overhead),
                   absl::ToDoubleMicroseconds(truth.request_overhead)));
  EXPECT_TRUE(near(absl::ToDoubleMicroseconds(fit->costs.fetch_per_row),
                   absl::ToDoubleMicroseconds(truth.fetch_per_row)));
  EXPECT_TRUE(near(absl::ToDoubleMicroseconds(fit->costs.router_overhead),
                   absl::ToDoubleMicroseconds(truth.router_overhead)));
  EXPECT_TRUE(near(absl::ToDoubleMicroseconds(fit->costs.background_cpu), 800))
      << fit->costs.background_cpu;
  // Nothing to fit from: a clear error.
  EXPECT_EQ(FitCosts(start, {}, warmup, simulate).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The latency rounds: the "real" run is the twin under a wide per-request slowdown; the fit
// starts from the same stage costs without one. The per-request ratio fit gives the twin a
// slowdown whose latency distribution is off (the ratio of two noisy times), and the rounds
// must bring it nearer the real one; without slowdown quantiles they are refused.
TEST(FitTest, LatencyRoundsBringTheLatencyDistributionNearer) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  const TwinOptions options = testing::TinyTwin(workload);
  const auto simulate = Replayer(options, workload, trace);
  CostModel truth = options.costs;
  truth.slowdown_quantiles = {0.4, 0.6, 0.8, 0.9, 1.0, 1.2, 1.6, 3.0};
  const uint64_t warmup = 1'000'000'000;
  const absl::StatusOr<SimulatedRun> real = simulate(truth);
  ASSERT_TRUE(real.ok());
  const std::vector<double> real_ms = SortedLatencies(real->outcomes, warmup);
  ASSERT_GT(real_ms.size(), 200u);
  EXPECT_EQ(LatencyDistance(real_ms, real_ms), 0);
  EXPECT_TRUE(std::is_sorted(real_ms.begin(), real_ms.end()));

  absl::StatusOr<FitResult> fit =
      FitCosts(options.costs, real->outcomes, warmup, simulate,
               {.max_iterations = 4, .slowdown_quantiles = 8, .latency_rounds = 6});
  ASSERT_TRUE(fit.ok()) << fit.status();
  std::vector<double> distances;
  for (const FitIteration& it : fit->iterations) {
    if (it.distance >= 0) distances.push_back(it.distance);
  }
  ASSERT_FALSE(distances.empty());
  // Round 0 is the ratio fit; the kept round is the nearest, and nearer than round 0 by a margin.
  EXPECT_EQ(fit->distance, *std::min_element(distances.begin(), distances.end()));
  EXPECT_LT(fit->distance, 0.75 * distances.front()) << distances.front();
  // The kept costs give the kept distance, and stay a valid slowdown.
  const absl::StatusOr<SimulatedRun> again = simulate(fit->costs);
  ASSERT_TRUE(again.ok());
  EXPECT_DOUBLE_EQ(LatencyDistance(real_ms, SortedLatencies(again->outcomes, warmup)),
                   fit->distance);
  EXPECT_TRUE(
      std::is_sorted(fit->costs.slowdown_quantiles.begin(), fit->costs.slowdown_quantiles.end()));

  EXPECT_EQ(FitCosts(options.costs, real->outcomes, warmup, simulate, {.latency_rounds = 2})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FitTest, LatencyDistanceIsTheLargestCdfGap) {
  const std::vector<double> a = {1, 2, 3, 4}, b = {2, 3, 4, 5}, c = {10, 20};
  EXPECT_DOUBLE_EQ(LatencyDistance(a, b), 0.25);  // at 1 (and at 4): 1/4 apart
  EXPECT_DOUBLE_EQ(LatencyDistance(a, c), 1.0);   // disjoint
  EXPECT_DOUBLE_EQ(LatencyDistance(a, {}), 1.0);
  const std::vector<double> ties = {2, 2, 2, 2};
  EXPECT_DOUBLE_EQ(LatencyDistance(a, ties), 0.5);  // at 2: 1/2 against 1
}

// EMB sampling (paper scale): the cache tracks 1 in N rows; every fetched row still crosses the
// link once and is counted once, and the hit rate stays near the row-level one.
TEST(TwinTest, SampledEmbChargesPerRowAndTracksRowLevelHits) {
  WorkloadConfig workload = testing::TinyWorkload();
  workload.features[0].rows = 64 * 1024;  // communities of 1024 rows
  workload.rate = 400;                    // enough sampled lookups to estimate from
  const std::vector<TraceRequest> trace = Generate(workload);
  // The popularity summary sees 1 in N keys: it keeps 1 in N of the configured counters.
  constexpr uint32_t kCounters = 256;
  std::map<uint32_t, uint32_t> tracked;  // by N, the most of any node's summary
  auto run = [&](uint32_t every, double* hit_rate) {
    TwinOptions options = testing::TinyTwin(workload);
    options.node.emb_sample = every;
    options.node.local.popularity_capacity = kCounters;
    std::unique_ptr<Twin> twin = RunTwin(options, workload, trace);
    for (size_t n = 0; n < twin->num_nodes(); ++n) {
      tracked[every] = std::max(tracked[every], twin->node(n).sketch->GetStats().tracked);
    }
    uint64_t hits = 0, misses = 0, ok = 0;
    for (const TwinOutcome& o : twin->outcomes()) {
      ok += o.code == absl::StatusCode::kOk;
      hits += o.emb_hits;
      misses += o.emb_misses;
    }
    EXPECT_EQ(ok, trace.size());
    ExpectEveryFetchedRowCrossesTheLinkOnce(*twin, misses);
    *hit_rate = static_cast<double>(hits) / static_cast<double>(hits + misses);
  };
  double rows = 0, sampled = 0;
  run(1, &rows);
  run(4, &sampled);
  EXPECT_GT(rows, 0.2);
  EXPECT_NEAR(sampled, rows, 0.05);
  EXPECT_EQ(tracked[1], kCounters);  // full: more distinct rows than counters
  EXPECT_EQ(tracked[4], kCounters / 4);
  TwinOptions bad = testing::TinyTwin(workload);
  bad.node.emb_sample = 0;
  auto twin = Twin::Create(bad, workload);
  ASSERT_FALSE(twin.ok());
  EXPECT_NE(twin.status().message().find("emb_sample"), std::string::npos) << twin.status();
}

// Sketched histories (paper speed): first visits' events are not drawn row by row; the twin's
// figures stay near the row-level sampled twin's, and a run repeats exactly.
TEST(TwinTest, SketchedHistoriesTrackTheRowLevelSampledTwin) {
  WorkloadConfig workload = testing::TinyWorkload();
  workload.features[0].rows = 64 * 1024;  // communities of 1024 rows
  workload.history_min = 100;
  workload.history_max = 300;
  workload.rate = 400;
  const std::vector<TraceRequest> trace = Generate(workload);
  struct Figures {
    double hit_rate = 0, mean_ms = 0, h_emb = 0, reused = 0;
    uint64_t ok = 0, hash = 0;
  };
  auto run = [&](bool sketch) {
    TwinOptions options = testing::TinyTwin(workload);
    options.node.local.pipeline.max_history = 512;
    options.node.emb_sample = 4;
    options.history_sketch = sketch;
    std::unique_ptr<Twin> twin = RunTwin(options, workload, trace);
    Figures f;
    uint64_t hits = 0, misses = 0;
    for (const TwinOutcome& o : twin->outcomes()) {
      f.ok += o.code == absl::StatusCode::kOk;
      hits += o.emb_hits;
      misses += o.emb_misses;
      f.mean_ms += static_cast<double>(o.latency_ns) / 1e6 / static_cast<double>(trace.size());
      f.h_emb += o.h_emb / static_cast<double>(trace.size());
      f.reused += o.cached_prefix_tokens;
    }
    ExpectEveryFetchedRowCrossesTheLinkOnce(*twin, misses);
    f.hit_rate = static_cast<double>(hits) / static_cast<double>(hits + misses);
    f.hash = twin->stats().log_hash;
    return f;
  };
  const Figures rows = run(false), sketched = run(true), again = run(true);
  // A node's KV budget is small: a few long first visits find no room, in both.
  EXPECT_GE(rows.ok, trace.size() * 99 / 100);
  EXPECT_GE(sketched.ok, trace.size() * 99 / 100);
  EXPECT_NEAR(sketched.hit_rate, rows.hit_rate, 0.05);
  EXPECT_NEAR(sketched.mean_ms, rows.mean_ms, 0.15 * rows.mean_ms);
  EXPECT_NEAR(sketched.h_emb, rows.h_emb, 0.1);
  EXPECT_NEAR(sketched.reused, rows.reused, 0.1 * rows.reused);
  EXPECT_NE(sketched.hash, rows.hash);  // another model: not the same run
  EXPECT_EQ(again.hash, sketched.hash);
  std::printf("row level / sketched: hits %.3f / %.3f, mean %.2f / %.2f ms, h_emb %.3f / %.3f\n",
              rows.hit_rate, sketched.hit_rate, rows.mean_ms, sketched.mean_ms, rows.h_emb,
              sketched.h_emb);
  // A request read without its events, at a twin that does not sketch: a clear error.
  {
    TwinOptions plain = testing::TinyTwin(workload);
    auto twin = Twin::Create(plain, workload);
    ASSERT_TRUE(twin.ok()) << twin.status();
    std::vector<TraceRequest> omitted = {trace.front()};
    omitted[0].omitted_events = omitted[0].new_events.size() / 2;
    omitted[0].new_events.clear();
    const absl::Status st = (*twin)->Run(Feed(omitted));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("does not sketch"), std::string::npos) << st;
  }
  TwinOptions bad = testing::TinyTwin(workload);
  bad.history_sketch = true;  // row level: nothing to sketch
  auto twin = Twin::Create(bad, workload);
  ASSERT_FALSE(twin.ok());
  EXPECT_NE(twin.status().message().find("history_sketch"), std::string::npos) << twin.status();
}

// The allocator's loop in the twin: a decision per node per closed window, α applied at the
// nodes, and the recovery controller silent on a Steady trace (issue 7's requirement).
TEST(ControlTest, RecoveryStaysSilentOnASteadyTraceAndDecisionsReachTheNodes) {
  WorkloadConfig workload = testing::TinyWorkload();
  workload.phases = {{.regime = Regime::kSteady, .duration = absl::Seconds(40)}};
  const std::vector<TraceRequest> trace = Generate(workload);
  const TwinOptions options = testing::TinyTwin(workload);
  auto run = [&](double alpha) {
    auto twin = Twin::Create(options, workload);
    EXPECT_TRUE(twin.ok()) << twin.status();
    auto records = RunControlled(
        **twin, Feed(trace), [&] { return *allocator::MakeRecovery(allocator::MakeStatic(alpha)); },
        {.window = options.node.local.node.window});
    EXPECT_TRUE(records.ok()) << records.status();
    for (size_t n = 0; n < (*twin)->num_nodes(); ++n) {
      EXPECT_NEAR((*twin)->node(n).node->Gauges().alpha_target, alpha, 1e-9);
    }
    return std::move(*records);
  };
  const std::vector<ControlRecord> records = run(0.7);
  EXPECT_GE(records.size(), 4u * 38);  // every node, every closed window
  for (const ControlRecord& r : records) {
    EXPECT_EQ(r.reason, allocator::Reason::kStatic) << "window " << r.window << ": " << r.detail;
  }
  // Another α on the same trace: every node decides every closed window again (one window more
  // or less per node: the last answers land at another time, and the last window closes or not).
  const size_t other = run(0.3).size();
  EXPECT_GE(other, 4u * 38);
  EXPECT_LE(other > records.size() ? other - records.size() : records.size() - other, 4u);
}

TEST(CostModelTest, NewFieldsRoundTripAndBadOnesNameTheField) {
  CostModel c;
  c.background_cpu = absl::Microseconds(750);
  c.slowdown_quantiles = {0.8, 1.0, 2.5};
  c.kv_dtype_bytes = 2;
  absl::StatusOr<CostModel> back = ParseCostModel(CostModelYaml(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->background_cpu, absl::Microseconds(750));
  EXPECT_EQ(back->slowdown_quantiles, c.slowdown_quantiles);
  EXPECT_EQ(back->kv_dtype_bytes, 2u);
  // The keyed slowdown stays within the quantiles and is the same for the same request.
  for (uint64_t user = 1; user < 200; ++user) {
    const double s = back->Slowdown(user, 7);
    EXPECT_GE(s, 0.8);
    EXPECT_LE(s, 2.5);
    EXPECT_EQ(s, back->Slowdown(user, 7));
  }
  for (const char* bad : {"flops_per_second: 1e12\nslowdown_quantiles: [1.0, 0.5]\n",
                          "flops_per_second: 1e12\nslowdown_quantiles: [0]\n",
                          "flops_per_second: 1e12\nkv_dtype_bytes: 9\n",
                          "flops_per_second: 1e12\nbackground_cpu: -1ms\n"}) {
    absl::StatusOr<CostModel> r = ParseCostModel(bad);
    ASSERT_FALSE(r.ok()) << bad;
    const std::string field = std::string(bad).substr(std::string(bad).find('\n') + 1);
    EXPECT_NE(r.status().message().find(field.substr(0, field.find(':'))), std::string::npos)
        << r.status();
  }
}

TEST(TrainTest, EveryNodeGetsAnEpisodeRewardedByTheClusterWindow) {
  WorkloadConfig base = testing::TinyWorkload();
  double alpha = 0;
  const WorkloadConfig workload =
      TrainingWorkload(base, {.length = absl::Seconds(20)}, 5, 3, &alpha);
  EXPECT_EQ(workload.phases.size(), 1u);
  EXPECT_NE(workload.seed, base.seed);
  EXPECT_GE(alpha, 0.1);
  EXPECT_LE(alpha, 0.9);
  // Keyed: the same (seed, index) gives the same trace config, another index another.
  EXPECT_EQ(
      WorkloadConfigYaml(TrainingWorkload(base, {.length = absl::Seconds(20)}, 5, 3, nullptr)),
      WorkloadConfigYaml(workload));
  EXPECT_NE(
      WorkloadConfigYaml(TrainingWorkload(base, {.length = absl::Seconds(20)}, 5, 4, nullptr)),
      WorkloadConfigYaml(workload));
  std::unique_ptr<allocator::PpoAgent> agent =
      *allocator::PpoAgent::Create(allocator::kNumFeatures, allocator::kActions.size(), {});
  const TwinOptions options = testing::TinyTwin(workload);
  absl::StatusOr<std::vector<allocator::PpoEpisode>> episodes = CollectEpisodes(
      options, workload, alpha, *agent, 9, {.window = options.node.local.node.window});
  ASSERT_TRUE(episodes.ok()) << episodes.status();
  ASSERT_EQ(episodes->size(), options.nodes);
  std::map<uint64_t, double> by_window;
  for (const allocator::PpoEpisode& e : *episodes) {
    EXPECT_GE(e.steps.size(), 17u);  // 1 s windows over 20 s, the last one unrewarded
    for (const allocator::PpoStep& s : e.steps) {
      auto [it, fresh] = by_window.emplace(s.window, s.reward);
      if (!fresh) {
        EXPECT_DOUBLE_EQ(it->second, s.reward) << "window " << s.window;
      }
    }
  }
  EXPECT_GE(by_window.size(), 17u);

  // With a P99 weight the same decisions (same agent, same keys) are rewarded less, by the
  // weight times the windows' P99 ÷ SLO, never by more than the weight times the cap.
  absl::StatusOr<std::vector<allocator::PpoEpisode>> weighted = CollectEpisodes(
      options, workload, alpha, *agent, 9, {.window = options.node.local.node.window}, {}, 0.5);
  ASSERT_TRUE(weighted.ok()) << weighted.status();
  ASSERT_EQ(weighted->size(), episodes->size());
  size_t lowered = 0;
  for (size_t n = 0; n < episodes->size(); ++n) {
    const allocator::PpoEpisode &e = (*episodes)[n], &w = (*weighted)[n];
    ASSERT_EQ(w.steps.size(), e.steps.size());
    for (size_t i = 0; i < e.steps.size(); ++i) {
      EXPECT_EQ(w.steps[i].action, e.steps[i].action);
      EXPECT_LE(w.steps[i].reward, e.steps[i].reward);
      EXPECT_GE(w.steps[i].reward, e.steps[i].reward - 0.5 * allocator::WindowState{}.p99_norm_cap);
      lowered += w.steps[i].reward < e.steps[i].reward;
    }
  }
  EXPECT_GT(lowered, 0u);
  allocator::WindowState state{.requests = 10, .p99_seconds = 0.015, .slo_seconds = 0.030};
  EXPECT_DOUBLE_EQ(TrainingReward(state, 0), allocator::Reward(state));
  EXPECT_DOUBLE_EQ(TrainingReward(state, 0.5), allocator::Reward(state) - 0.25);
}

TEST(TwinTest, CalibrationLearnsFromTheAnswersAndSetsTheRoutersWeights) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  TwinOptions options = testing::TinyTwin(workload);
  const router::Weights configured = RunTwin(options, workload, trace)->router().weights();
  EXPECT_FALSE(RunTwin(options, workload, trace)->calibration().has_value());

  options.calibration = router::CalibrationOptions{.half_life = 100, .min_samples = 20};
  options.calibration_every = 16;
  std::unique_ptr<Twin> twin = RunTwin(options, workload, trace);
  const std::optional<router::CalibrationState> st = twin->calibration();
  ASSERT_TRUE(st.has_value());
  ASSERT_TRUE(st->calibrated);
  EXPECT_EQ(st->load_samples, trace.size());  // every answer carries the load it was routed at
  EXPECT_GT(st->c_kv, 0);
  EXPECT_GT(st->c_emb, 0);
  const router::Weights w = twin->router().weights();
  EXPECT_NEAR(w.kv + w.emb + w.load, 1, 1e-9);
  EXPECT_NE(w.kv, configured.kv);  // applied, not the configured shares
  EXPECT_NE(w.emb, configured.emb);

  options.calibration_every = 0;
  EXPECT_NE(Twin::Create(options, workload).status().message().find("twin.calibration_every"),
            std::string::npos);
}

TEST(TwinTest, BadOptionsNameTheField) {
  const WorkloadConfig workload = testing::TinyWorkload();
  TwinOptions options = testing::TinyTwin(workload);
  options.nodes = 0;
  EXPECT_NE(Twin::Create(options, workload).status().message().find("twin.nodes"),
            std::string::npos);
  options = testing::TinyTwin(workload);
  options.node.local.pipeline.features.pop_back();
  EXPECT_EQ(Twin::Create(options, workload).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hlem::sim
