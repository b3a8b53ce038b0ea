#include "router/core/profile.h"

#include <algorithm>
#include <map>
#include <vector>

#include "common/rng.h"
#include "gtest/gtest.h"

namespace hlem::router {
namespace {

const std::vector<FeatureShards> kFeatures = {{.table_id = 0, .residency_shard_rows = 100},
                                              {.table_id = 1, .residency_shard_rows = 10}};

TEST(ShardProfileTest, TopKByCountThenByShard) {
  // Events (item, category): items 5, 150, 160, 170, 999; categories 1, 1, 25, 25, 25.
  const std::vector<uint64_t> ids = {5, 1, 150, 1, 160, 25, 170, 25, 999, 25};
  const ShardProfile p = ShardProfile::Build(ids, kFeatures, 3);
  ASSERT_EQ(p.size(), 3u);
  // Counts: item shard 1 (150,160,170) = 3, category shard 2 (25 ×3) = 3, category shard 0 = 2,
  // item shards 0 and 9 = 1 each.
  EXPECT_EQ(p.entries()[0].shard, (ShardKey{0, 1}));
  EXPECT_EQ(p.entries()[0].count, 3u);
  EXPECT_EQ(p.entries()[1].shard, (ShardKey{1, 2}));
  EXPECT_EQ(p.entries()[2].shard, (ShardKey{1, 0}));
  EXPECT_EQ(p.entries()[2].count, 2u);
  EXPECT_TRUE(ShardProfile::Build({}, kFeatures, 3).empty());
}

TEST(ShardProfileTest, ExtendAddsNewEvents) {
  ShardProfile p = ShardProfile::Build(std::vector<uint64_t>{5, 1, 150, 1}, kFeatures, 2);
  // category shard 0 ×2 first; then items 0..99 (shard 0) once each... add three events of item
  // shard 7 and category 33.
  p.Extend(std::vector<uint64_t>{700, 33, 710, 33, 720, 33}, kFeatures, 2);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p.entries()[0].shard, (ShardKey{0, 7}));
  EXPECT_EQ(p.entries()[0].count, 3u);
  EXPECT_EQ(p.entries()[1].shard, (ShardKey{1, 3}));
}

// A history over thousands of shards per feature: the per-feature tally merges into the map
// every 512 distinct shards (and on runs of one shard); the profile must be the exact top K.
TEST(ShardProfileTest, HistoriesOverThousandsOfShardsCountExactly) {
  Rng rng(9);
  std::vector<uint64_t> ids;
  for (int e = 0; e < 40000; ++e) {
    // Item: 3 000 shards, the low ones more often (the smaller of two draws); runs of a repeated
    // event; category: 2 000 shards.
    const uint64_t item = std::min(rng() % 3000, rng() % 3000) * 100 + rng() % 100;
    const int repeat = rng() % 5 == 0 ? 3 : 1;
    for (int r = 0; r < repeat; ++r) {
      ids.push_back(item);
      ids.push_back(rng() % 20000);
    }
  }
  std::map<std::pair<uint32_t, uint64_t>, uint32_t> naive;
  for (size_t i = 0; i < ids.size(); i += 2) {
    naive[{0, ids[i] / 100}] += 1;
    naive[{1, ids[i + 1] / 10}] += 1;
  }
  std::vector<ProfileEntry> want;
  for (const auto& [k, n] : naive) want.push_back({ShardKey{k.first, k.second}, n});
  std::sort(want.begin(), want.end(), [](const ProfileEntry& a, const ProfileEntry& b) {
    if (a.count != b.count) return a.count > b.count;
    if (a.shard.table_id != b.shard.table_id) return a.shard.table_id < b.shard.table_id;
    return a.shard.id < b.shard.id;
  });
  ASSERT_GT(want.size(), 4000u);
  for (uint32_t k : {20u, 700u, 5000u}) {
    const ShardProfile p = ShardProfile::Build(ids, kFeatures, k);
    ASSERT_EQ(p.size(), std::min<size_t>(k, want.size()));
    for (size_t i = 0; i < p.size(); ++i) {
      ASSERT_EQ(p.entries()[i].shard, want[i].shard) << "k " << k << " entry " << i;
      ASSERT_EQ(p.entries()[i].count, want[i].count) << "k " << k << " entry " << i;
    }
  }
  // The sketch's way in: counts made elsewhere, a shard listed twice summed, zeros dropped.
  const ShardProfile t = ShardProfile::TopOf(
      std::vector<ProfileEntry>{
          {ShardKey{0, 4}, 2}, {ShardKey{1, 9}, 3}, {ShardKey{0, 4}, 2}, {ShardKey{0, 5}, 0}},
      5);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t.entries()[0].shard, (ShardKey{0, 4}));
  EXPECT_EQ(t.entries()[0].count, 4u);
  EXPECT_EQ(t.entries()[1].shard, (ShardKey{1, 9}));
}

}  // namespace
}  // namespace hlem::router
