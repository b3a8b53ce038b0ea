#pragma once
// Helpers shared by the EmbCache tests.

#include <memory>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/hbm_pool.h"

namespace hlem::serving::testing {

inline std::unique_ptr<HbmPool> MakePool(uint32_t pages, uint64_t page_bytes) {
  return *HbmPool::Create({.pool_bytes = pages * page_bytes, .page_bytes = page_bytes});
}

inline std::unique_ptr<EmbCache> MakeCache(HbmPool& pool, Clock& clock, EmbCacheOptions options) {
  auto cache = EmbCache::Create(options, pool, clock);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return std::move(cache).value();
}

// One table 0 of `row_bytes` rows, residency shards of 4 rows.
inline EmbCacheOptions OneTable(uint32_t row_bytes, uint32_t budget,
                                EmbPolicy policy = EmbPolicy::kLru) {
  return {.tables = {{.table_id = 0, .row_bytes = row_bytes}},
          .residency_shard_rows = 4,
          .policy = policy,
          .budget_pages = budget};
}

}  // namespace hlem::serving::testing
