#include "serving_node/core/emb_cache.h"
#include "serving_node/core/emb_cache_testing.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hlem::serving {
namespace {

using ::testing::HasSubstr;
using ::testing::TestWithParam;
using ::testing::Values;

using testing::MakeCache;
using testing::MakePool;
using testing::OneTable;

uint64_t MustInsert(EmbCache& cache, uint32_t table, uint64_t row) {
  absl::StatusOr<uint64_t> off = cache.Insert(table, row);
  EXPECT_TRUE(off.ok()) << off.status();
  return off.ok() ? *off : kEmbMiss;
}

// Offset of `row` when it hits, kEmbMiss otherwise.
uint64_t LookupOne(EmbCache& cache, uint32_t table, uint64_t row) {
  EmbLookupResult r;
  uint64_t rows[1] = {row};
  EXPECT_TRUE(cache.Lookup(table, rows, &r).ok());
  return r.offsets[0];
}

TEST(EmbCacheTest, SlotArithmetic) {
  EXPECT_EQ(EmbCache::SlotOffset(4096, 3, 5, 256), 3u * 4096 + 5 * 256);
  EXPECT_EQ(EmbCache::SlotOffset(uint64_t{2} << 20, 40959, 1, 2048),
            uint64_t{40959} * (2 << 20) + 2048);
  SimClock clock;
  auto pool = MakePool(4, 4096);
  auto cache = MakeCache(*pool, clock, OneTable(256, 4));
  EXPECT_EQ(cache->SlotsPerPage(256), 16u);
  EXPECT_EQ(cache->SlotsPerPage(3000), 1u);
  EXPECT_EQ(cache->SlotOffset(2, 7, 256), pool->PageOffset(2) + 7 * 256);
  // A fresh pool hands out page 0 first; slots fill in order.
  EXPECT_EQ(MustInsert(*cache, 0, 100), 0u);
  EXPECT_EQ(MustInsert(*cache, 0, 101), 256u);
  for (uint64_t r = 102; r < 116; ++r) MustInsert(*cache, 0, r);
  EXPECT_EQ(MustInsert(*cache, 0, 116), pool->PageOffset(1));  // page 0 is full
}

TEST(EmbCacheTest, RejectsBadOptions) {
  SimClock clock;
  auto pool = MakePool(4, 4096);
  auto expect_invalid = [&](EmbCacheOptions o, const std::string& field) {
    auto c = EmbCache::Create(o, *pool, clock);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(c.status().message()).find(field), std::string::npos) << c.status();
  };
  expect_invalid({}, "tables");
  expect_invalid({.tables = {{0, 0}}}, "row_bytes");
  expect_invalid({.tables = {{0, 4097}}}, "row_bytes");
  expect_invalid({.tables = {{0, 256}, {0, 512}}}, "appears twice");
  expect_invalid({.tables = {{0, 256}}, .residency_shard_rows = 0}, "residency_shard_rows");
  EXPECT_TRUE(EmbCache::Create({.tables = {{0, 4096}}}, *pool, clock).ok());
}

TEST(EmbCacheTest, HitMissInsertRoundTrip) {
  SimClock clock;
  auto pool = MakePool(4, 4096);
  auto cache = MakeCache(*pool, clock, OneTable(256, 4));
  std::vector<uint64_t> rows = {1, 2, 3};
  EmbLookupResult r;
  ASSERT_TRUE(cache->Lookup(0, rows, &r).ok());
  EXPECT_EQ(r.hits, 0u);
  EXPECT_EQ(r.miss_positions, (std::vector<uint32_t>{0, 1, 2}));
  uint64_t off1 = MustInsert(*cache, 0, 1);
  uint64_t off3 = MustInsert(*cache, 0, 3);
  EXPECT_NE(off1, off3);
  ASSERT_TRUE(cache->Lookup(0, rows, &r).ok());
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.offsets, (std::vector<uint64_t>{off1, kEmbMiss, off3}));
  EXPECT_EQ(r.miss_positions, (std::vector<uint32_t>{1}));
  // A duplicate insert keeps the slot and is not a new entry.
  EXPECT_EQ(MustInsert(*cache, 0, 3), off3);
  EXPECT_EQ(cache->Peek(0, 3), off3);
  EXPECT_EQ(cache->Peek(0, 2), std::nullopt);
  EmbCacheStats s = cache->GetStats();
  EXPECT_EQ(s.lookups, 6u);
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.inserts, 2u);
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.pages_held, 1u);
  EXPECT_EQ(s.bytes_held, 4096u);
  EXPECT_EQ(cache->ResidentRows(0, 0), 2u);  // rows 1, 3 are in residency shard 0 (4 rows)
  // Unknown table.
  EXPECT_EQ(cache->Lookup(9, rows, &r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Insert(9, 1).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint64_t> offs;
  EXPECT_EQ(cache->InsertBatch(9, rows, &offs).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

TEST(EmbCacheTest, SeveralRowSizesShareTheCache) {
  SimClock clock;
  auto pool = MakePool(8, 4096);
  EmbCacheOptions o{.tables = {{0, 256}, {1, 1024}, {2, 256}, {3, 3000}}, .budget_pages = 8};
  auto cache = MakeCache(*pool, clock, o);
  absl::flat_hash_map<PageId, uint32_t> page_row_bytes;
  struct Want {
    uint32_t table, row_bytes;
    uint64_t row, off;
  };
  std::vector<Want> all;
  const uint32_t row_bytes[] = {256, 1024, 256, 3000};
  auto insert = [&](uint32_t t, uint64_t r) {
    uint64_t off = MustInsert(*cache, t, r);
    PageId page = static_cast<PageId>(off / 4096);
    EXPECT_EQ((off % 4096) % row_bytes[t], 0u);
    EXPECT_LE(off % 4096 + row_bytes[t], 4096u);
    auto [it, fresh] = page_row_bytes.emplace(page, row_bytes[t]);
    EXPECT_EQ(it->second, row_bytes[t]) << "page " << page << " holds two row sizes";
    all.push_back({t, row_bytes[t], r, off});
  };
  for (uint64_t r = 0; r < 10; ++r) {
    for (uint32_t t = 0; t < 3; ++t) insert(t, r);
  }
  // Tables 0 and 2 (both 256 B) share pages: 20 rows on 16-slot pages make 2 pages; 10 rows of
  // 1 KiB make 3 pages. 3000 B rows (one per page) get the 3 pages left of the budget of 8.
  EXPECT_EQ(cache->GetStats().pages_held, 5u);
  for (uint64_t r = 0; r < 10; ++r) insert(3, r);
  EmbCacheStats s = cache->GetStats();
  EXPECT_EQ(s.pages_held, 8u);
  EXPECT_EQ(s.evictions, 7u);
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), 8u);
  std::set<uint64_t> offsets;
  for (const Want& w : all) {
    uint64_t got = LookupOne(*cache, w.table, w.row);
    if (w.table != 3 || w.row >= 7) {
      EXPECT_EQ(got, w.off) << "table " << w.table << " row " << w.row;
      EXPECT_TRUE(offsets.insert(got).second);
    } else {
      EXPECT_EQ(got, kEmbMiss) << "row " << w.row;
    }
  }
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

TEST(EmbCacheTest, ResourceExhaustedWithoutAPage) {
  SimClock clock;
  auto pool = MakePool(4, 4096);
  auto cache = MakeCache(*pool, clock, {.tables = {{0, 256}, {1, 1024}}});
  EXPECT_EQ(cache->Insert(0, 1).status().code(), absl::StatusCode::kResourceExhausted);
  std::vector<uint64_t> rows = {1, 2}, offs;
  EXPECT_EQ(cache->InsertBatch(0, rows, &offs).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(offs.empty());
  EXPECT_EQ(pool->free_pages(), 4u);
  // Budget of one page, taken by the 256 B rows: no page for 1 KiB rows.
  cache->SetBudgetPages(1);
  MustInsert(*cache, 0, 1);
  EXPECT_EQ(cache->Insert(1, 1).status().code(), absl::StatusCode::kResourceExhausted);
  // Budget allows more but the pool is empty (the KV side holds the rest).
  cache->SetBudgetPages(4);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool->AllocPage(PageOwner::kKv).ok());
  EXPECT_EQ(cache->Insert(1, 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->GetStats().insert_exhausted, 4u);
  EXPECT_EQ(cache->GetStats().pages_held, 1u);
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

TEST(EmbCacheTest, LruOrderUnderPressure) {
  SimClock clock;
  auto pool = MakePool(2, 1024);
  auto cache = MakeCache(*pool, clock, OneTable(256, 1));  // one page of 4 slots
  uint64_t off[8];
  for (uint64_t r = 0; r < 4; ++r) off[r] = MustInsert(*cache, 0, r);
  EXPECT_NE(LookupOne(*cache, 0, 0), kEmbMiss);  // 0 is now the most recent
  off[4] = MustInsert(*cache, 0, 4);             // evicts 1
  EXPECT_EQ(off[4], off[1]);
  EXPECT_EQ(LookupOne(*cache, 0, 1), kEmbMiss);
  off[5] = MustInsert(*cache, 0, 5);  // evicts 2
  EXPECT_EQ(off[5], off[2]);
  EXPECT_EQ(MustInsert(*cache, 0, 3), off[3]);  // refresh 3
  off[6] = MustInsert(*cache, 0, 6);            // evicts 0 (3 was refreshed)
  EXPECT_EQ(off[6], off[0]);
  EXPECT_EQ(LookupOne(*cache, 0, 3), off[3]);
  EXPECT_EQ(LookupOne(*cache, 0, 4), off[4]);
  EXPECT_EQ(LookupOne(*cache, 0, 0), kEmbMiss);
  EXPECT_EQ(cache->GetStats().evictions, 3u);
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), 1u);  // the budget held
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

// A hit within the promotion window leaves the entry where it is, at most `window` entries from
// the most recent end, so it outlives at least capacity - window later admissions; a hit outside
// the window promotes. promotion_window 0 is exact LRU.
TEST(EmbCacheTest, PromotionWindowBoundsTheLruApproximation) {
  for (double window : {0.0, 1.0 / 16}) {
    SCOPED_TRACE(window);
    SimClock clock;
    auto pool = MakePool(2, 64 * 256);
    EmbCacheOptions options = OneTable(256, 1);  // one page of 64 slots: window 4 entries
    options.promotion_window = window;
    auto cache = MakeCache(*pool, clock, options);
    for (uint64_t r = 0; r < 64; ++r) MustInsert(*cache, 0, r);
    ASSERT_NE(LookupOne(*cache, 0, 62), kEmbMiss);  // 1 push ago: inside a window of 4
    ASSERT_NE(LookupOne(*cache, 0, 0), kEmbMiss);   // 63 pushes ago: promoted either way
    // 61 admissions evict the 61 oldest: rows 1..61.
    for (uint64_t r = 100; r < 161; ++r) MustInsert(*cache, 0, r);
    // Peek: no recency change while checking.
    for (uint64_t r = 1; r < 62; ++r) ASSERT_FALSE(cache->Peek(0, r).has_value()) << r;
    EXPECT_TRUE(cache->Peek(0, 62).has_value());  // survived >= 64 - 4 admissions after its hit
    EXPECT_TRUE(cache->Peek(0, 63).has_value());
    EXPECT_TRUE(cache->Peek(0, 0).has_value());
    // Exact LRU moved 62 ahead of 63, so 63 goes next; in the window 62 stayed behind 63.
    MustInsert(*cache, 0, 200);
    EXPECT_EQ(cache->Peek(0, 62).has_value(), window == 0);
    EXPECT_EQ(cache->Peek(0, 63).has_value(), window != 0);
    EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  }
}

TEST(EmbCacheTest, PromotionWindowOutOfRangeIsRejected) {
  SimClock clock;
  auto pool = MakePool(2, 1024);
  for (double bad : {-0.1, 0.6}) {
    EmbCacheOptions options = OneTable(256, 1);
    options.promotion_window = bad;
    auto cache = EmbCache::Create(options, *pool, clock);
    ASSERT_FALSE(cache.ok());
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(cache.status().message(), HasSubstr("promotion_window"));
  }
}

// After a Shrink the residency counts of the dropped pages are subtracted in bounded batches;
// ResidentRows is exact at every point of the drain.
TEST(EmbCacheTest, ResidentRowsExactWhileShrunkCountsDrain) {
  SimClock clock;
  auto pool = MakePool(8, 64 * 256);
  auto cache = MakeCache(*pool, clock, OneTable(256, 8));  // 8 pages of 64 slots, shards of 4
  Rng rng(3);
  for (int i = 0; i < 512; ++i) MustInsert(*cache, 0, rng() % 4096);
  std::vector<PageId> freed;
  ASSERT_EQ(cache->Shrink(4, &freed), 4u);
  auto check_all = [&] {
    for (uint64_t shard = 0; shard < 1024; ++shard) {
      uint64_t n = 0;
      for (uint64_t row = shard * 4; row < shard * 4 + 4; ++row)
        n += cache->Peek(0, row).has_value();
      ASSERT_EQ(cache->ResidentRows(0, shard), n) << "shard " << shard;
    }
  };
  // One query leaves most of the counts pending (it does not drain them all under the lock).
  ASSERT_EQ(cache->ResidentRows(0, 0),
            uint64_t{cache->Peek(0, 0).has_value()} + cache->Peek(0, 1).has_value() +
                cache->Peek(0, 2).has_value() + cache->Peek(0, 3).has_value());
  int calls = 0;
  while (cache->DrainPending(1)) {
    if (++calls % 16 == 0) check_all();  // each check drains a little more
  }
  EXPECT_GT(calls, 0);
  check_all();
  EXPECT_FALSE(cache->DrainPending(100));
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

class EmbCachePolicyTest : public TestWithParam<EmbPolicy> {};

TEST_P(EmbCachePolicyTest, BudgetRespectedAndMovable) {
  SimClock clock;
  auto pool = MakePool(10, 1024);
  auto cache = MakeCache(*pool, clock, OneTable(256, 3, GetParam()));
  for (uint64_t r = 0; r < 100; ++r) MustInsert(*cache, 0, r);
  EXPECT_EQ(cache->GetStats().pages_held, 3u);
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), 3u);
  EXPECT_EQ(cache->GetStats().entries, 12u);
  cache->SetBudgetPages(5);
  for (uint64_t r = 100; r < 200; ++r) MustInsert(*cache, 0, r);
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), 5u);
  std::vector<PageId> freed;
  cache->SetBudgetPages(2, &freed);
  EXPECT_EQ(freed.size(), 3u);
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), 2u);
  EXPECT_EQ(pool->free_pages(), 8u);
  for (PageId p : freed) EXPECT_EQ(pool->owner(p), PageOwner::kFree);
  for (uint64_t r = 200; r < 300; ++r) MustInsert(*cache, 0, r);
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), 2u);
  EXPECT_EQ(cache->GetStats().entries, 8u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

TEST_P(EmbCachePolicyTest, ShrinkDropsTheColdestPagesAndOnlyTheirEntries) {
  SimClock clock;
  auto pool = MakePool(10, 1024);
  auto cache = MakeCache(*pool, clock, OneTable(256, 8, GetParam()));
  absl::flat_hash_map<uint64_t, uint64_t> offset;  // row -> slot offset
  for (uint64_t r = 0; r < 32; ++r) offset[r] = MustInsert(*cache, 0, r);
  ASSERT_EQ(pool->pages_owned(PageOwner::kEmb), 8u);
  // Pages of rows 8..15 (pages 2, 3) stay cold; the others are looked up many times.
  std::vector<uint64_t> hot;
  for (uint64_t r = 0; r < 32; ++r) {
    if (r < 8 || r >= 16) hot.push_back(r);
  }
  EmbLookupResult lr;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(cache->Lookup(0, hot, &lr).ok());
  ASSERT_EQ(lr.hits, hot.size());
  uint64_t shard2_before = cache->ResidentRows(0, 2);  // rows 8..11
  EXPECT_EQ(shard2_before, 4u);

  std::vector<PageId> freed;
  EXPECT_EQ(cache->Shrink(2, &freed), 2u);
  std::sort(freed.begin(), freed.end());
  EXPECT_EQ(freed, (std::vector<PageId>{2, 3}));
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), 6u);
  EXPECT_EQ(pool->free_pages(), 4u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
  EXPECT_EQ(cache->budget_pages(), 6u);
  EmbCacheStats s = cache->GetStats();
  EXPECT_EQ(s.pages_held, 6u);
  EXPECT_EQ(s.shrunk_pages, 2u);
  EXPECT_EQ(s.shrunk_entries, 8u);
  EXPECT_EQ(s.entries, 24u);
  EXPECT_EQ(s.stale_entries + s.stale_dropped, 8u);
  EXPECT_EQ(cache->ResidentRows(0, 2), 0u);
  EXPECT_EQ(cache->ResidentRows(0, 3), 0u);
  EXPECT_EQ(cache->ResidentRows(0, 1), 4u);
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  for (uint64_t r = 0; r < 32; ++r) {
    PageId page = static_cast<PageId>(offset[r] / 1024);
    bool dropped = page == 2 || page == 3;
    EXPECT_EQ(dropped, r >= 8 && r < 16);
    EXPECT_EQ(LookupOne(*cache, 0, r), dropped ? kEmbMiss : offset[r]) << "row " << r;
  }
  // The KV side can take the freed pages; the cache never serves them again.
  ASSERT_TRUE(pool->AllocPage(PageOwner::kKv).ok());
  ASSERT_TRUE(pool->AllocPage(PageOwner::kKv).ok());
  EXPECT_EQ(cache->GetStats().stale_entries, 0u);  // every stale entry was looked up or swept
  EXPECT_EQ(cache->Shrink(100, &freed), 6u);       // all that is held
  EXPECT_EQ(pool->pages_owned(PageOwner::kEmb), 0u);
  EXPECT_EQ(cache->budget_pages(), 0u);
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

TEST_P(EmbCachePolicyTest, InsertBatchNeverEvictsItsOwnRows) {
  SimClock clock;
  auto pool = MakePool(2, 4096);
  auto cache = MakeCache(*pool, clock, OneTable(256, 1, GetParam()));  // 16 slots
  std::vector<uint64_t> rows, offs;
  for (uint64_t r = 0; r < 16; ++r) rows.push_back(r);
  ASSERT_TRUE(cache->InsertBatch(0, rows, &offs).ok());
  // 8 resident rows and 8 new ones: the new ones must evict the 8 others, not the batch's rows.
  rows.clear();
  for (uint64_t r = 8; r < 24; ++r) rows.push_back(r);
  EmbLookupResult lr;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache->Lookup(0, rows, &lr).ok());  // make them known
  ASSERT_TRUE(cache->InsertBatch(0, rows, &offs).ok());
  ASSERT_EQ(offs.size(), 16u);
  EXPECT_EQ(std::set<uint64_t>(offs.begin(), offs.end()).size(), 16u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(cache->Peek(0, rows[i]), offs[i]);
  // A batch larger than the cache fills it and then says so.
  rows.clear();
  for (uint64_t r = 100; r < 117; ++r) rows.push_back(r);
  EXPECT_EQ(cache->InsertBatch(0, rows, &offs).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(offs.size(), 16u);
  EXPECT_EQ(std::set<uint64_t>(offs.begin(), offs.end()).size(), 16u);
  for (size_t i = 0; i < offs.size(); ++i) EXPECT_EQ(cache->Peek(0, rows[i]), offs[i]);
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

INSTANTIATE_TEST_SUITE_P(EmbPolicies, EmbCachePolicyTest,
                         Values(EmbPolicy::kLru, EmbPolicy::kTinyLfu),
                         [](const auto& info) { return std::string(EmbPolicyName(info.param)); });

// Hit rate of lookup-then-insert-on-miss over a Zipf stream.
double ZipfHitRate(EmbPolicy policy, double exponent, uint64_t seed,
                   double promotion_window = EmbCacheOptions().promotion_window) {
  SimClock clock;
  constexpr uint64_t kRowBytes = 256, kSlotsPerPage = 50;
  auto pool = MakePool(100, kRowBytes * kSlotsPerPage);  // 5 000 slots
  EmbCacheOptions options = OneTable(kRowBytes, 100, policy);
  options.promotion_window = promotion_window;
  auto cache = MakeCache(*pool, clock, options);
  ZipfSampler zipf(100000, exponent);
  Rng rng(seed);
  constexpr int kWarmup = 50000, kMeasured = 250000;
  uint64_t hits = 0;
  EmbLookupResult r;
  for (int i = 0; i < kWarmup + kMeasured; ++i) {
    uint64_t row[1] = {Mix64(zipf(rng)) % (uint64_t{1} << 40)};  // popularity not by row id
    EXPECT_TRUE(cache->Lookup(0, row, &r).ok());
    if (r.hits == 1) {
      hits += i >= kWarmup;
    } else if (!cache->Insert(0, row[0]).ok()) {
      ADD_FAILURE() << "insert failed";
      return 0;
    }
  }
  EXPECT_TRUE(cache->CheckInvariants().ok());
  return static_cast<double>(hits) / kMeasured;
}

// The policy choice on Zipf traces: W-TinyLFU must not be worse than LRU (it is 6-11 points
// better), and the promotion window must cost next to nothing against exact LRU order.
TEST(EmbCacheZipfTest, PolicyAndPromotionWindowHitRates) {
  for (double exponent : {1.0, 0.8}) {
    double rate[2][2];  // [policy][exact order, with the promotion window]
    for (EmbPolicy policy : {EmbPolicy::kLru, EmbPolicy::kTinyLfu}) {
      const int p = static_cast<int>(policy);
      rate[p][0] = ZipfHitRate(policy, exponent, 11, 0.0);
      rate[p][1] = ZipfHitRate(policy, exponent, 11);
      std::cout << "zipf " << exponent << " rows 100000 slots 5000 " << EmbPolicyName(policy)
                << ": hit rate " << rate[p][1] << " (exact order " << rate[p][0] << ")\n";
      EXPECT_GE(rate[p][1], rate[p][0] - 0.005) << EmbPolicyName(policy) << " zipf " << exponent;
    }
    EXPECT_GE(rate[1][1], rate[0][1] - 0.01) << "zipf " << exponent;
    EXPECT_GT(rate[0][1], 0.05);
  }
}

}  // namespace
}  // namespace hlem::serving
