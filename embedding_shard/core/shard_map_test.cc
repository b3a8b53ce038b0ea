#include "embedding_shard/core/shard_map.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace hlem::shard {
namespace {

TableSpec Spec(uint64_t rows, uint32_t id = 0) {
  return TableSpec{.id = id, .name = "t", .rows = rows, .dim = 4, .dtype = Dtype::kFp32};
}

TEST(ShardMapTest, RejectsBadOptions) {
  EXPECT_FALSE(ShardMap::Create({.num_shards = 0}).ok());
  EXPECT_FALSE(ShardMap::Create({.num_shards = 2, .replicas = 3}).ok());
  EXPECT_FALSE(ShardMap::Create({.num_shards = 2, .replicas = 0}).ok());
  auto bad = ShardMap::Create({.num_shards = 2, .replicas = 3});
  EXPECT_NE(bad.status().message().find("replicas"), std::string_view::npos);
}

TEST(ShardMapTest, RangePartitionsAreContiguous) {
  auto map = *ShardMap::Create({.num_shards = 3});
  TableSpec spec = Spec(10);
  EXPECT_EQ(map.SlotsPerPartition(spec), 4u);
  EXPECT_EQ(map.SlotOfRow(spec, 7), 7u);
  EXPECT_EQ(map.PartitionOfSlot(spec, 7), 1u);
  EXPECT_EQ(map.PartitionSlots(spec, 2).first, 8u);
  EXPECT_EQ(map.PartitionSlots(spec, 2).count, 2u);
}

TEST(ShardMapTest, HashIsABijectionWithInverse) {
  auto map = *ShardMap::Create({.num_shards = 4, .partitioning = Partitioning::kHash});
  for (uint64_t rows : {1ull, 2ull, 3ull, 17ull, 1000ull, 4097ull, 65536ull}) {
    TableSpec spec = Spec(rows, 5);
    std::vector<bool> seen(rows, false);
    for (uint64_t r = 0; r < rows; ++r) {
      uint64_t slot = map.SlotOfRow(spec, r);
      ASSERT_LT(slot, rows);
      ASSERT_FALSE(seen[slot]) << "rows=" << rows << " r=" << r;
      seen[slot] = true;
      ASSERT_EQ(map.RowOfSlot(spec, slot), r);
    }
  }
}

TEST(ShardMapTest, HashSpreadsConsecutiveRows) {
  auto map = *ShardMap::Create({.num_shards = 4, .partitioning = Partitioning::kHash});
  TableSpec spec = Spec(100000);
  std::vector<int> per_partition(4, 0);
  for (uint64_t r = 0; r < 1000; ++r)
    ++per_partition[map.PartitionOfSlot(spec, map.SlotOfRow(spec, r))];
  for (int n : per_partition) EXPECT_NEAR(n, 250, 60);
  // Different tables get different permutations.
  EXPECT_NE(map.SlotOfRow(Spec(100000, 0), 1), map.SlotOfRow(Spec(100000, 1), 1));
}

TEST(ShardMapTest, ReplicasAreConsistentBothWays) {
  auto map = *ShardMap::Create({.num_shards = 5, .replicas = 3});
  for (uint32_t p = 0; p < 5; ++p) {
    auto servers = map.ServersOf(p);
    ASSERT_EQ(servers.size(), 3u);
    EXPECT_EQ(servers[0], p);
    EXPECT_EQ(std::set<uint32_t>(servers.begin(), servers.end()).size(), 3u);
    for (uint32_t s : servers) {
      auto held = map.PartitionsOn(s);
      EXPECT_NE(std::find(held.begin(), held.end(), p), held.end());
    }
  }
  for (uint32_t s = 0; s < 5; ++s) EXPECT_EQ(map.PartitionsOn(s).size(), 3u);
}

}  // namespace
}  // namespace hlem::shard
