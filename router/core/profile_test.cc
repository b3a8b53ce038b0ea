#include "router/core/profile.h"

#include <vector>

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

}  // namespace
}  // namespace hlem::router
