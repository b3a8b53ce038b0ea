#include "sim/workload/history_sketch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/workload/workload_testing.h"

namespace hlem::sim {
namespace {

using ::testing::HasSubstr;

// 64 communities of 16 384 items (4 residency shards of 4 096 rows each) and a category table
// of 64 rows per community; head_ranks 2 048 leaves a fifth of the item mass to the tail path.
WorkloadConfig Config() {
  WorkloadConfig c = testing::TinyWorkload(7);
  c.features = {{"item", 0, 64 * 16384}, {"category", 1, 64 * 64}};
  c.residency_shard_rows = 4096;
  c.users = 100000;
  c.hot_users = 100;
  return c;
}

HistorySketchOptions Options() {
  return {.every = 16, .table_ids = {0, 1}, .shard_rows = {4096, 16}, .head_ranks = 2048};
}

struct Totals {
  double sampled[2] = {0, 0};           // sampled rows with repeats
  double sampled_distinct[2] = {0, 0};  // distinct sampled rows
  double distinct[2] = {0, 0};          // distinct rows (expected, for the sketch)
};

std::set<std::pair<uint32_t, uint64_t>> TopShards(std::map<std::pair<uint32_t, uint64_t>, double> c,
                                                  size_t k) {
  std::vector<std::pair<double, std::pair<uint32_t, uint64_t>>> v;
  for (const auto& [key, n] : c) v.emplace_back(-n, key);
  std::sort(v.begin(), v.end());
  std::set<std::pair<uint32_t, uint64_t>> out;
  for (size_t i = 0; i < std::min(k, v.size()); ++i) out.insert(v[i].second);
  return out;
}

TEST(HistorySketchTest, AgreesWithRowLevelHistories) {
  const WorkloadConfig config = Config();
  auto g = WorkloadGenerator::Create(config);
  ASSERT_TRUE(g.ok()) << g.status();
  const HistorySketchOptions o = Options();
  auto sketcher = HistorySketcher::Create(**g, o);
  ASSERT_TRUE(sketcher.ok()) << sketcher.status();
  Totals row, sk;
  double overlap = 0, users = 0;
  constexpr uint64_t kEvents = 2000;
  for (uint64_t user = 1000; user < 1300; ++user) {
    std::vector<uint64_t> ids;
    (*g)->AppendEventsOf(user, 0, kEvents, &ids);
    std::map<std::pair<uint32_t, uint64_t>, double> row_shards, sk_shards;
    for (size_t f = 0; f < 2; ++f) {
      std::set<uint64_t> all, sampled;
      for (size_t j = 0; j < kEvents; ++j) {
        const uint64_t r = ids[j * 2 + f];
        all.insert(r);
        row_shards[{static_cast<uint32_t>(f), r / o.shard_rows[f]}] += 1;
        if (EmbSampled(o.table_ids[f], r, o.every)) {
          row.sampled[f] += 1;
          sampled.insert(r);
        }
      }
      row.sampled_distinct[f] += static_cast<double>(sampled.size());
      row.distinct[f] += static_cast<double>(all.size());
    }
    const HistorySketch& s = (*sketcher)->Sketch(user, 0, kEvents);
    EXPECT_EQ(s.events, kEvents);
    double shard_events = 0;
    for (const HistorySketch::Shard& e : s.shards) {
      sk_shards[{e.feature, e.shard}] += e.events;
      shard_events += e.events;
    }
    // Every event in one shard per feature, but for shards of less than half an event.
    EXPECT_LE(shard_events, 2.0 * kEvents + 1e-3);
    EXPECT_GE(shard_events, 0.97 * 2.0 * kEvents);
    for (size_t f = 0; f < 2; ++f) {
      for (uint64_t r : s.features[f].sampled) {
        ASSERT_TRUE(EmbSampled(o.table_ids[f], r, o.every)) << "feature " << f << " row " << r;
      }
      sk.sampled[f] += static_cast<double>(s.features[f].sampled.size());
      sk.sampled_distinct[f] += static_cast<double>(
          std::set<uint64_t>(s.features[f].sampled.begin(), s.features[f].sampled.end()).size());
      sk.distinct[f] += s.features[f].distinct;
    }
    const auto a = TopShards(row_shards, 20), b = TopShards(sk_shards, 20);
    std::vector<std::pair<uint32_t, uint64_t>> common;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
    overlap += static_cast<double>(common.size()) / static_cast<double>(a.size());
    users += 1;
  }
  for (size_t f = 0; f < 2; ++f) {
    SCOPED_TRACE(f);
    EXPECT_NEAR(sk.sampled[f] / row.sampled[f], 1.0, 0.05);
    EXPECT_NEAR(sk.sampled_distinct[f] / row.sampled_distinct[f], 1.0, 0.05);
    EXPECT_NEAR(sk.distinct[f] / row.distinct[f], 1.0, 0.03);
  }
  std::printf(
      "sampled %.4f %.4f, sampled distinct %.4f %.4f, distinct %.4f %.4f, top-20 overlap %.3f\n",
      sk.sampled[0] / row.sampled[0], sk.sampled[1] / row.sampled[1],
      sk.sampled_distinct[0] / row.sampled_distinct[0],
      sk.sampled_distinct[1] / row.sampled_distinct[1], sk.distinct[0] / row.distinct[0],
      sk.distinct[1] / row.distinct[1], overlap / users);
  EXPECT_GE(overlap / users, 0.85);  // the router's top-20 shards mostly the same
}

// A range cut at a multiple of 256 events (the sketch's blocks) gives the same rows as the whole;
// so a returning user's regenerated history uses the rows its first visit used (but for the
// partial blocks at its ends). Two sketchers agree.
TEST(HistorySketchTest, RangesCutAtBlocksGiveTheSameRowsAndRunsRepeat) {
  auto g = WorkloadGenerator::Create(Config());
  ASSERT_TRUE(g.ok());
  auto a = HistorySketcher::Create(**g, Options());
  auto b = HistorySketcher::Create(**g, Options());
  ASSERT_TRUE(a.ok() && b.ok());
  for (uint64_t user : {5u, 77u, 4242u}) {
    const std::vector<uint64_t> whole = (*a)->Sketch(user, 0, 3000).features[0].sampled;
    EXPECT_EQ((*b)->Sketch(user, 0, 3000).features[0].sampled, whole);
    std::vector<uint64_t> cut = (*a)->Sketch(user, 0, 1280).features[0].sampled;
    const std::vector<uint64_t> rest = (*a)->Sketch(user, 1280, 3000 - 1280).features[0].sampled;
    cut.insert(cut.end(), rest.begin(), rest.end());
    EXPECT_EQ(cut, whole) << "user " << user;
    EXPECT_FALSE(whole.empty());
    // Inside a block, event by event: the same rows again however it is cut.
    std::vector<uint64_t> pieces = (*a)->Sketch(user, 1300, 40).features[0].sampled;
    const std::vector<uint64_t> more = (*b)->Sketch(user, 1340, 60).features[0].sampled;
    pieces.insert(pieces.end(), more.begin(), more.end());
    EXPECT_EQ(pieces, (*b)->Sketch(user, 1300, 100).features[0].sampled);
  }
}

TEST(HistorySketchTest, ExpectedDistinctGrowsToTheCommunitysRows) {
  auto g = WorkloadGenerator::Create(Config());
  ASSERT_TRUE(g.ok());
  auto s = HistorySketcher::Create(**g, Options());
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ((*s)->ExpectedDistinct(0, 3, 0), 0);
  EXPECT_NEAR((*s)->ExpectedDistinct(0, 3, 1), 1, 1e-9);
  EXPECT_NEAR((*s)->ExpectedDistinct(1, 3, 1), 1, 1e-9);
  double last = 0;
  for (uint64_t m : {2u, 10u, 100u, 1000u, 100000u, 10000000u}) {
    const double d = (*s)->ExpectedDistinct(0, 3, m);
    EXPECT_GT(d, last);
    EXPECT_LE(d, static_cast<double>(std::min<uint64_t>(m, 16384)) + 1e-6);
    last = d;
  }
  EXPECT_NEAR((*s)->ExpectedDistinct(1, 3, 10000000), 64, 0.5);  // the whole slice

  // A derived feature of one row per community: that row, however many events (its probability
  // rounds to a hair over 1; that once made a NaN).
  WorkloadConfig one = Config();
  one.features = {{"item", 0, 64 * 1024}, {"category", 1, 64}};
  one.residency_shard_rows = 1024;
  auto g1 = WorkloadGenerator::Create(one);
  ASSERT_TRUE(g1.ok());
  auto s1 = HistorySketcher::Create(**g1, Options());
  ASSERT_TRUE(s1.ok());
  for (uint64_t m : {1u, 2u, 50u, 5000u}) EXPECT_NEAR((*s1)->ExpectedDistinct(1, 9, m), 1, 1e-9);
}

TEST(HistorySketchTest, BadOptionsNameTheField) {
  auto g = WorkloadGenerator::Create(Config());
  ASSERT_TRUE(g.ok());
  HistorySketchOptions o = Options();
  o.every = 1;
  EXPECT_THAT(HistorySketcher::Create(**g, o).status().message(), HasSubstr("every"));
  o = Options();
  o.table_ids = {0};
  EXPECT_THAT(HistorySketcher::Create(**g, o).status().message(), HasSubstr("table_ids"));
  o = Options();
  o.shard_rows = {4096, 0};
  EXPECT_THAT(HistorySketcher::Create(**g, o).status().message(), HasSubstr("shard_rows"));
  // A derived feature of more than 65 536 rows per community.
  WorkloadConfig wide = Config();
  wide.features[1].rows = 64 * 70000;
  auto gw = WorkloadGenerator::Create(wide);
  ASSERT_TRUE(gw.ok()) << gw.status();
  EXPECT_THAT(HistorySketcher::Create(**gw, Options()).status().message(),
              HasSubstr("feature 1: 70000 rows per community"));
}

}  // namespace
}  // namespace hlem::sim
