#include "sim/workload/workload.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/workload/stats.h"
#include "sim/workload/workload_testing.h"

namespace hlem::sim {
namespace {

using ::testing::HasSubstr;

// A small catalogue: 64 communities of 128 items (2 residency shards of 64 rows each), short
// histories, 1 s windows.
WorkloadConfig Small(Regime regime, absl::Duration duration) {
  WorkloadConfig c = testing::TinyWorkload(42);
  c.features = {{"item", 0, 64 * 128}, {"category", 1, 256}};
  c.users = 200000;
  c.hot_users = 500;
  c.history_min = 50;
  c.history_max = 150;
  c.new_events_mean = 4;
  c.candidates = 10;
  c.rate = 200;
  c.window = absl::Seconds(1);
  c.phases = {{.regime = regime,
               .duration = duration,
               .hot_ratio = 0.2,
               .hot_ratio_end = 0.5,
               .burst_ratio = 0.5,
               .bursts_per_hour = 90}};
  return c;
}

TraceStats Measure(WorkloadGenerator& g, std::vector<double>* p_hot = nullptr) {
  TraceAnalyzer a(StatsOptionsFor(g.config()), g.config().features.size());
  TraceRequest r;
  while (g.Next(&r)) a.Add(r);
  TraceStats st = a.Finish();
  if (p_hot != nullptr) {
    for (size_t w = 0; w < st.windows.size(); ++w) {
      p_hot->push_back(g.HotProbability(w * 1'000'000'000 + 500'000'000));
    }
  }
  return st;
}

// Mean realized hot ratio over windows [from, to) whose p_hot matches `want` (any when < 0).
double MeanHot(const TraceStats& st, size_t from, size_t to, const std::vector<double>& p_hot,
               double want = -1) {
  uint64_t requests = 0, hot = 0;
  for (size_t w = from; w < std::min(to, st.windows.size()); ++w) {
    if (want >= 0 && std::abs(p_hot[w] - want) > 1e-9) continue;
    requests += st.windows[w].requests;
    hot += st.windows[w].hot;
  }
  return requests == 0 ? -1 : static_cast<double>(hot) / requests;
}

TEST(WorkloadTest, SteadyHasItsRateHotRatioPopularityAndLocality) {
  auto g = *WorkloadGenerator::Create(Small(Regime::kSteady, absl::Seconds(120)));
  std::vector<double> p_hot;
  const TraceStats st = Measure(*g, &p_hot);
  std::printf(
      "steady: %llu requests, %.1f/s, hot %.3f, zipf %.3f, coverage %.3f (p10 %.3f, %llu "
      "users), mean history %.1f\n",
      static_cast<unsigned long long>(st.requests), st.rate,
      MeanHot(st, 12, st.windows.size(), p_hot), st.item_zipf, st.coverage_mean, st.coverage_p10,
      static_cast<unsigned long long>(st.coverage_users), st.mean_history_events);
  // Poisson arrivals: 24 000 expected, σ ≈ 155.
  EXPECT_NEAR(static_cast<double>(st.requests), 24000, 4 * 155);
  EXPECT_NEAR(st.rate, 200, 200 * 0.03);
  // After the first 12 windows the realized hot-user ratio follows p_hot.
  EXPECT_NEAR(MeanHot(st, 12, st.windows.size(), p_hot), 0.2, 0.02);
  EXPECT_NEAR(st.item_zipf, 1.0, 0.1);
  EXPECT_GE(st.coverage_mean, 0.9);
  EXPECT_GE(st.coverage_users, 1000u);
  EXPECT_GT(st.mean_history_events, 50);
  EXPECT_EQ(st.candidates, st.requests * 10);
}

TEST(WorkloadTest, TrendDriftsAndBurstsSpike) {
  auto trend = *WorkloadGenerator::Create(Small(Regime::kTrend, absl::Seconds(120)));
  std::vector<double> p_hot;
  TraceStats st = Measure(*trend, &p_hot);
  const double early = MeanHot(st, 12, 30, p_hot), late = MeanHot(st, 100, 120, p_hot);
  std::printf("trend: hot %.3f early, %.3f late\n", early, late);
  EXPECT_NEAR(early, 0.2 + 0.3 * 21.0 / 120, 0.04);
  EXPECT_NEAR(late, 0.2 + 0.3 * 110.0 / 120, 0.04);

  auto burst = *WorkloadGenerator::Create(Small(Regime::kBurst, absl::Seconds(600)));
  p_hot.clear();
  st = Measure(*burst, &p_hot);
  // Spikes of 3–5 windows at 0.5; 0.2 between them.
  int spikes = 0;
  for (size_t w = 0; w < p_hot.size();) {
    if (p_hot[w] != 0.5) {
      ++w;
      continue;
    }
    size_t e = w;
    while (e < p_hot.size() && p_hot[e] == 0.5) ++e;
    if (e < p_hot.size()) {  // a spike cut by the end of the trace may be shorter
      EXPECT_GE(e - w, 3u);
      EXPECT_LE(e - w, 5u);
    }
    ++spikes;
    w = e;
  }
  std::printf("burst: %d spikes, hot %.3f in them, %.3f between\n", spikes,
              MeanHot(st, 12, st.windows.size(), p_hot, 0.5),
              MeanHot(st, 12, st.windows.size(), p_hot, 0.2));
  EXPECT_GE(spikes, 5);  // 90 an hour over 10 minutes: 15 expected
  EXPECT_NEAR(MeanHot(st, 12, st.windows.size(), p_hot, 0.5), 0.5, 0.06);
  EXPECT_NEAR(MeanHot(st, 12, st.windows.size(), p_hot, 0.2), 0.2, 0.03);
}

TEST(WorkloadTest, EveryBurstPhaseHoldsASpike) {
  // 30 s at 10 spikes an hour: a Poisson draw leaves 92 % of such phases without one.
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    WorkloadConfig c = Small(Regime::kBurst, absl::Seconds(30));
    c.seed = seed;
    c.phases[0].bursts_per_hour = 10;
    auto g = *WorkloadGenerator::Create(c);
    int spike_windows = 0;
    for (uint64_t w = 0; w < 30; ++w) {
      spike_windows += g->HotProbability(w * 1'000'000'000 + 500'000'000) == 0.5;
    }
    EXPECT_GE(spike_windows, 1) << "seed " << seed;  // (a drawn one may be cut by the end)
  }
}

TEST(WorkloadTest, SameSeedSameRequestsAndReturningUsersGrow) {
  const WorkloadConfig c = Small(Regime::kSteady, absl::Seconds(10));
  auto a = *WorkloadGenerator::Create(c);
  auto b = *WorkloadGenerator::Create(c);
  WorkloadConfig other = c;
  other.seed = 43;
  auto d = *WorkloadGenerator::Create(other);
  TraceRequest ra, rb, rd;
  bool differs = false, returning = false;
  absl::flat_hash_map<uint64_t, uint64_t> sent;
  while (a->Next(&ra)) {
    ASSERT_TRUE(b->Next(&rb));
    ASSERT_EQ(ra, rb);
    if (d->Next(&rd) && !(rd == ra)) differs = true;
    EXPECT_EQ(ra.prior_events, sent[ra.user]);
    if (ra.prior_events > 0) returning = true;
    sent[ra.user] += ra.new_events.size() / 2;
    for (size_t i = 0; i < ra.new_events.size(); i += 2) {
      EXPECT_LT(ra.new_events[i], c.features[0].rows);
      EXPECT_LT(ra.new_events[i + 1], c.features[1].rows);
    }
  }
  EXPECT_FALSE(b->Next(&rb));
  EXPECT_TRUE(differs);
  EXPECT_TRUE(returning);
}

TEST(WorkloadConfigTest, YamlRoundTripsAndErrorsNameTheField) {
  WorkloadConfig c = Small(Regime::kBurst, absl::Seconds(90));
  c.phases.push_back({.regime = Regime::kTrend, .duration = absl::Minutes(2)});
  auto parsed = ParseWorkloadConfig(WorkloadConfigYaml(c));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(WorkloadConfigYaml(*parsed), WorkloadConfigYaml(c));

  auto error = [](const std::string& yaml) {
    auto r = ParseWorkloadConfig(yaml);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_THAT(error("communities: 10"), HasSubstr("workload.communities"));
  EXPECT_THAT(error("communities: 100"), HasSubstr("whole residency shards"));
  EXPECT_THAT(error("home_share: 0.5"), HasSubstr("workload.home_share"));
  EXPECT_THAT(error("phases: [{regime: sometimes, duration: 1m}]"),
              HasSubstr("workload.phases[0].regime"));
  EXPECT_THAT(error("phases: [{regime: burst, duration: 1m, burst_min_windows: 6}]"),
              HasSubstr("burst_min_windows"));
  EXPECT_THAT(error("users: 10\nhot_users: 20"), HasSubstr("workload.users"));
  EXPECT_THAT(error("rates: 5"), HasSubstr("rates"));
  EXPECT_THAT(error("rate: [1]"), HasSubstr("workload.rate"));
  EXPECT_EQ(error(""), "ok");  // every field has a default
  // Feature names go into trace headers as they are: identifiers only (found by
  // workload_config_fuzz: a name with control characters wrote YAML that did not read back).
  const std::string two = "\n  - {name: category, table_id: 1, rows: 10000}";
  EXPECT_THAT(error("features:\n  - {name: \"item\\a\", table_id: 0, rows: 1048576}" + two),
              HasSubstr("workload.features[0].name: 'item\\007'"));
  EXPECT_THAT(error("features:\n  - {name: \"a,b\", table_id: 0, rows: 1048576}" + two),
              HasSubstr("features[0].name"));
  EXPECT_EQ(error("features:\n  - {name: item.id-2_x, table_id: 0, rows: 1048576}" + two), "ok");
  // A request's ids stay under kMaxRequestIds (trace_file_fuzz: a reader sized a generated record
  // from a count no config could produce). The default config has two features.
  EXPECT_THAT(error("history_max: 9000000"), HasSubstr("workload.history_max"));
  EXPECT_THAT(error("history_max: 15000\nhistory_scale: 1000"), HasSubstr("workload.history_max"));
  EXPECT_EQ(error("history_max: 8000000"), "ok");
  auto tables = [](int n) {
    std::string yaml = "features:";
    for (int f = 0; f < n; ++f) {
      absl::StrAppend(&yaml, "\n  - {name: t", f, ", table_id: ", f, ", rows: 1048576}");
    }
    return yaml;
  };
  EXPECT_EQ(error(tables(200)), "ok");
  EXPECT_THAT(error(tables(20) + "\nnew_events_mean: 1000000"),
              HasSubstr("workload.new_events_mean"));
  EXPECT_THAT(error(tables(200) + "\ncandidates: 100000"), HasSubstr("workload.candidates"));
}

}  // namespace
}  // namespace hlem::sim
