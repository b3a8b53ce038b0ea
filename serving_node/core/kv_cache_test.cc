#include "serving_node/core/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace hlem::serving {
namespace {

using Kind = ResidencyEvent::Kind;

// 2 layers × 2 (K, V) × kv_dim 4 × 1 byte = 16 bytes a token: a 256-byte page holds 16 tokens.
constexpr uint64_t kPageBytes = 256;
constexpr uint32_t kPt = 16;

KvCacheOptions SmallOptions() {
  KvCacheOptions o;
  o.layers = 2;
  o.kv_dim = 4;
  o.dtype_bytes = 1;
  return o;
}

std::vector<uint64_t> Tokens(uint64_t seed, size_t n) {
  std::vector<uint64_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = KeyedHash(seed, i);
  return t;
}

std::span<const uint64_t> Prefix(const std::vector<uint64_t>& v, size_t n) {
  return std::span<const uint64_t>(v).first(n);
}

std::vector<ResidencyEvent> EventsFrom(const ResidencyEventLog& log, uint64_t from_seq) {
  absl::StatusOr<std::vector<ResidencyEvent>> events = log.Since(from_seq);
  EXPECT_TRUE(events.ok()) << events.status();
  return events.ok() ? *std::move(events) : std::vector<ResidencyEvent>{};
}

struct Ev {
  Kind kind;
  uint64_t user;
  uint64_t tokens;
  bool operator==(const Ev&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Ev& e) {
  return os << "{" << static_cast<int>(e.kind) << ", user " << e.user << ", " << e.tokens << "}";
}

class KvCacheTest : public ::testing::Test {
 protected:
  void Init(uint32_t pages, KvCacheOptions options = SmallOptions()) {
    pool_ = *HbmPool::Create({.pool_bytes = pages * kPageBytes, .page_bytes = kPageBytes});
    auto cache = KvCache::Create(options, *pool_, &log_, clock_);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = *std::move(cache);
    ASSERT_EQ(cache_->page_tokens(), kPt);
  }
  // Appends n tokens of `tokens` after the user's current (matching) prefix.
  KvAppendResult MustAppend(uint64_t user, const std::vector<uint64_t>& tokens, size_t upto) {
    KvPrefix p = cache_->Lookup(user, tokens).prefix;
    auto r =
        cache_->Append(user, p, std::span<const uint64_t>(tokens).subspan(p.len, upto - p.len));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_TRUE(cache_->CommitAppend(user, r->prefix).ok());
    return *r;
  }
  // The events published after `seq`.
  std::vector<Ev> EventsSince(uint64_t seq) {
    std::vector<Ev> out;
    for (const ResidencyEvent& e : EventsFrom(log_, seq + 1)) {
      out.push_back({e.kind, e.user_id, e.tokens});
    }
    return out;
  }
  std::vector<Ev> Events() { return EventsSince(0); }
  void ExpectConsistent() {
    EXPECT_TRUE(pool_->CheckInvariants().ok()) << pool_->CheckInvariants();
    EXPECT_TRUE(cache_->CheckInvariants().ok()) << cache_->CheckInvariants();
  }

  SimClock clock_;
  ResidencyEventLog log_{/*epoch=*/1, /*capacity=*/1 << 20};
  std::unique_ptr<HbmPool> pool_;
  std::unique_ptr<KvCache> cache_;
};

TEST(KvPageLayoutTest, PageTokensAndOffsets) {
  // HSTU-like: 3 layers, 8 heads × 64 = 512, fp16, 2 MiB pages: 6144 bytes a token → 341 tokens.
  KvCacheOptions o{.layers = 3, .kv_dim = 512, .dtype_bytes = 2};
  auto layout = KvPageLayout::Make(o, 2 << 20);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->page_tokens, 341u);
  EXPECT_EQ(layout->vector_bytes(), 1024u);
  EXPECT_EQ(layout->OffsetInPage(0, KvPart::kKey, 0), 0u);
  EXPECT_EQ(layout->OffsetInPage(0, KvPart::kKey, 1), 1024u);
  EXPECT_EQ(layout->OffsetInPage(0, KvPart::kValue, 0), 341u * 1024);
  EXPECT_EQ(layout->OffsetInPage(1, KvPart::kKey, 0), 2u * 341 * 1024);
  EXPECT_EQ(layout->OffsetInPage(1, KvPart::kValue, 5), (3u * 341 + 5) * 1024);
  EXPECT_LE(layout->OffsetInPage(2, KvPart::kValue, 340) + layout->vector_bytes(), 2u << 20);

  auto pool = *HbmPool::Create({.pool_bytes = 4 << 20, .page_bytes = 2 << 20});
  SimClock clock;
  auto cache = *KvCache::Create(o, *pool, nullptr, clock);
  EXPECT_EQ(cache->page_tokens(), 341u);
  EXPECT_EQ(cache->ByteOffset(1, 2, KvPart::kValue, 7),
            (uint64_t{2} << 20) + (5u * 341 + 7) * 1024);
}

TEST(KvPageLayoutTest, RejectsInvalidOptions) {
  auto pool = *HbmPool::Create({.pool_bytes = 4 * 256, .page_bytes = 256});
  SimClock clock;
  auto code = [&](KvCacheOptions o) {
    return KvCache::Create(o, *pool, nullptr, clock).status().code();
  };
  EXPECT_EQ(code({.layers = 0, .kv_dim = 4, .dtype_bytes = 1}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.layers = 2, .kv_dim = 0, .dtype_bytes = 1}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.layers = 2, .kv_dim = 4, .dtype_bytes = 3}), absl::StatusCode::kInvalidArgument);
  // 2 × 2 × 64 × 1 = 256 bytes: exactly one token fits; 65 does not.
  EXPECT_TRUE(
      KvCache::Create({.layers = 2, .kv_dim = 64, .dtype_bytes = 1}, *pool, nullptr, clock).ok());
  auto too_big =
      KvCache::Create({.layers = 2, .kv_dim = 65, .dtype_bytes = 1}, *pool, nullptr, clock);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_big.status().message()).find("holds 0 tokens"), std::string::npos);
  KvCacheOptions negative_idle = SmallOptions();
  negative_idle.reclaim_min_idle = absl::Seconds(-1);
  EXPECT_EQ(code(negative_idle), absl::StatusCode::kInvalidArgument);
}

TEST(KvHashTest, ExtendsTokenByToken) {
  auto t = Tokens(1, 10);
  EXPECT_EQ(KvHash({}), kKvHashSeed);
  EXPECT_EQ(KvHash(t), KvHash(std::span<const uint64_t>(t).subspan(4), KvHash(Prefix(t, 4))));
  EXPECT_EQ(KvHash(Prefix(t, 1)), KvHashExtend(kKvHashSeed, t[0]));
  auto swapped = t;
  std::swap(swapped[2], swapped[3]);
  EXPECT_NE(KvHash(t), KvHash(swapped));
  EXPECT_NE(KvHash(Prefix(t, 9)), KvHash(t));
}

TEST_F(KvCacheTest, LookupAppendRoundTrip) {
  Init(8);
  auto h = Tokens(7, 30);
  KvLookupResult miss = cache_->Lookup(5, h);
  EXPECT_EQ(miss.prefix, KvPrefix{});
  EXPECT_FALSE(miss.evicted_stale);
  EXPECT_FALSE(cache_->Info(5).has_value());  // a lookup miss creates no entry

  auto r = cache_->Append(5, KvPrefix{}, Prefix(h, 20));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prefix, (KvPrefix{20, KvHash(Prefix(h, 20))}));
  std::vector<PageId> bt = cache_->BlockTable(5);
  ASSERT_EQ(bt.size(), 2u);
  EXPECT_NE(bt[0], bt[1]);
  EXPECT_EQ(r->runs, (std::vector<KvSlotRun>{{bt[0], 0, 16}, {bt[1], 0, 4}}));
  EXPECT_EQ(r->evicted_users, 0u);
  // Reserved, not visible until committed (the caller has not written the K/V yet).
  EXPECT_EQ(cache_->Lookup(5, h).prefix.len, 0u);
  EXPECT_EQ(cache_->cached_len(5), 0u);
  EXPECT_TRUE(cache_->Info(5)->append_in_flight);
  EXPECT_TRUE(Events().empty());
  ASSERT_TRUE(cache_->CommitAppend(5, r->prefix).ok());
  EXPECT_FALSE(cache_->Info(5)->append_in_flight);
  EXPECT_EQ(cache_->Info(5)->pins, 0u);

  KvLookupResult hit = cache_->Lookup(5, Prefix(h, 25));
  EXPECT_EQ(hit.prefix, r->prefix);
  EXPECT_EQ(hit.pages, bt);
  EXPECT_FALSE(hit.evicted_stale);

  auto r2 = cache_->Append(5, hit.prefix, std::span<const uint64_t>(h).subspan(20, 10));
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->prefix, (KvPrefix{30, KvHash(h)}));
  EXPECT_EQ(r2->runs, (std::vector<KvSlotRun>{{bt[1], 4, 10}}));
  ASSERT_TRUE(cache_->CommitAppend(5, r2->prefix).ok());
  EXPECT_EQ(cache_->cached_len(5), 30u);
  EXPECT_EQ(cache_->BlockTable(5), bt);
  EXPECT_EQ(cache_->Lookup(5, h).prefix.len, 30u);

  // Exactly filling a page, then one more token: a new page at slot 0.
  auto r3 = MustAppend(5, Tokens(7, 33), 32);
  EXPECT_EQ(r3.runs, (std::vector<KvSlotRun>{{bt[1], 14, 2}}));
  EXPECT_EQ(cache_->BlockTable(5).size(), 2u);
  auto r4 = MustAppend(5, Tokens(7, 33), 33);
  ASSERT_EQ(cache_->BlockTable(5).size(), 3u);
  EXPECT_EQ(r4.runs, (std::vector<KvSlotRun>{{cache_->BlockTable(5)[2], 0, 1}}));

  KvCacheStats s = cache_->Stats();
  EXPECT_EQ(s.lookups, 6u);
  EXPECT_EQ(s.lookup_hits, 4u);
  EXPECT_EQ(s.tokens_requested, 30u + 30 + 25 + 30 + 33 + 33);
  EXPECT_EQ(s.tokens_reused, 20u + 30 + 30 + 32);
  EXPECT_EQ(s.appends, 4u);
  EXPECT_EQ(s.tokens_appended, 33u);
  EXPECT_EQ(s.pages_held, 3u);
  EXPECT_EQ(s.users_held, 1u);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 3u);
  EXPECT_EQ(Events(), (std::vector<Ev>{{Kind::kKvStored, 5, 20},
                                       {Kind::kKvStored, 5, 30},
                                       {Kind::kKvStored, 5, 32},
                                       {Kind::kKvStored, 5, 33}}));
  ExpectConsistent();
}

TEST_F(KvCacheTest, EditedHistoryEvictsAndIsNeverServed) {
  Init(8);
  auto h = Tokens(3, 40);
  MustAppend(9, h, 20);
  auto edited = h;
  edited[3] ^= 1;
  KvLookupResult r = cache_->Lookup(9, edited);
  EXPECT_EQ(r.prefix, KvPrefix{});
  EXPECT_TRUE(r.evicted_stale);
  EXPECT_EQ(cache_->cached_len(9), 0u);
  EXPECT_TRUE(cache_->BlockTable(9).empty());
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 0u);
  EXPECT_EQ(cache_->Stats().evictions_mismatch, 1u);
  EXPECT_EQ(Events().back(), (Ev{Kind::kKvEvicted, 9, 0}));
  // The edit in the last, partial page is caught too.
  MustAppend(9, h, 20);
  edited = h;
  edited[19] ^= 1;
  EXPECT_EQ(cache_->Lookup(9, edited).prefix.len, 0u);
  EXPECT_EQ(cache_->Stats().evictions_mismatch, 2u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, HistoryShorterThanCachedPrefixEvicts) {
  Init(8);
  auto h = Tokens(4, 40);
  MustAppend(2, h, 20);
  KvLookupResult r = cache_->Lookup(2, Prefix(h, 19));
  EXPECT_EQ(r.prefix.len, 0u);
  EXPECT_TRUE(r.evicted_stale);
  EXPECT_EQ(cache_->cached_len(2), 0u);
  EXPECT_EQ(cache_->Lookup(2, h).prefix.len, 0u);  // gone, not resurrected
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 0u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, MismatchOfPinnedUserRetiresPagesUntilUnpin) {
  Init(8);
  auto h = Tokens(5, 40);
  cache_->Pin(1);
  MustAppend(1, h, 20);
  std::vector<PageId> old_pages = cache_->BlockTable(1);
  // Request A of user 1 reads its prefix's pages; request B (edited history) drops them.
  KvLookupResult a = cache_->Lookup(1, h);
  EXPECT_EQ(a.pages, old_pages);
  EXPECT_EQ(a.prefix.len, 20u);
  auto other = Tokens(6, 40);
  KvLookupResult r = cache_->Lookup(1, other);
  EXPECT_TRUE(r.pages.empty());
  EXPECT_TRUE(r.evicted_stale);
  ASSERT_TRUE(cache_->Info(1).has_value());
  EXPECT_EQ(cache_->Info(1)->pins, 1u);
  EXPECT_EQ(cache_->Info(1)->retired_pages, 2u);
  // Re-appending the new history never reuses the retired pages.
  MustAppend(1, other, 20);
  for (PageId p : cache_->BlockTable(1)) {
    EXPECT_EQ(std::count(old_pages.begin(), old_pages.end(), p), 0) << p;
  }
  for (PageId p : a.pages) EXPECT_EQ(pool_->owner(p), PageOwner::kKv);  // A's still
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 4u);
  EXPECT_EQ(cache_->Stats().pages_held, 4u);
  ExpectConsistent();
  ASSERT_TRUE(cache_->Unpin(1).ok());
  EXPECT_EQ(cache_->Info(1)->retired_pages, 0u);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 2u);
  EXPECT_EQ(cache_->Lookup(1, other).prefix.len, 20u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, AppendInFlightBlocksOthersAndCanBeAborted) {
  Init(8);
  auto h = Tokens(11, 40);
  MustAppend(1, h, 10);
  const KvPrefix p10{10, KvHash(Prefix(h, 10))};
  auto r = cache_->Append(1, p10, std::span<const uint64_t>(h).subspan(10, 20));  // 1 new page
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(cache_->Info(1)->pins, 1u);  // the append holds the user
  EXPECT_EQ(cache_->Reclaim(100, 100).size(), 0u);
  // A second request with the same (still current) prefix loses: one append at a time.
  EXPECT_EQ(cache_->Append(1, p10, std::span<const uint64_t>(h).subspan(10, 5)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache_->Unpin(1).code(), absl::StatusCode::kFailedPrecondition);  // not the caller's
  EXPECT_EQ(cache_->CommitAppend(1, p10).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 2u);
  ASSERT_TRUE(cache_->AbortAppend(1, r->prefix).ok());
  EXPECT_EQ(cache_->AbortAppend(1, r->prefix).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache_->CommitAppend(1, r->prefix).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 1u);
  EXPECT_EQ(cache_->Info(1)->prefix, p10);
  EXPECT_EQ(cache_->Info(1)->pins, 0u);
  EXPECT_EQ(cache_->Lookup(1, h).prefix, p10);
  EXPECT_EQ(cache_->Stats().appends_aborted, 1u);
  ExpectConsistent();

  // The KV dropped while an append is in flight (a newer request with an edited history): the
  // commit is refused, every page comes back once the last pin goes.
  cache_->Pin(1);
  r = cache_->Append(1, p10, std::span<const uint64_t>(h).subspan(10, 20));
  ASSERT_TRUE(r.ok());
  auto edited = h;
  edited[0] ^= 1;
  EXPECT_TRUE(cache_->Lookup(1, edited).evicted_stale);
  EXPECT_EQ(cache_->Info(1)->retired_pages, 2u);
  EXPECT_EQ(cache_->Append(1, KvPrefix{}, Prefix(edited, 4)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExpectConsistent();
  EXPECT_EQ(cache_->CommitAppend(1, r->prefix).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(cache_->cached_len(1), 0u);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 2u);  // retired until the caller's Unpin
  ASSERT_TRUE(cache_->Unpin(1).ok());
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 0u);
  EXPECT_FALSE(cache_->Info(1).has_value());
  EXPECT_EQ(Events().back(), (Ev{Kind::kKvEvicted, 1, 0}));
  ExpectConsistent();

  // Evict of a user whose only pages are an append's reservation: nothing was stored.
  r = cache_->Append(2, KvPrefix{}, Prefix(h, 5));
  ASSERT_TRUE(r.ok());
  const uint64_t seq = log_.last_seq();
  EXPECT_FALSE(cache_->Evict(2));
  EXPECT_EQ(log_.last_seq(), seq);
  EXPECT_EQ(cache_->CommitAppend(2, r->prefix).code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(cache_->Info(2).has_value());
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 0u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, StaleAppendFailsAndChangesNothing) {
  Init(8);
  auto h = Tokens(8, 40);
  MustAppend(4, h, 10);
  const uint64_t seq = log_.last_seq();
  const auto bt = cache_->BlockTable(4);
  const KvPrefix good{10, KvHash(Prefix(h, 10))};
  for (KvPrefix stale : {KvPrefix{}, KvPrefix{5, KvHash(Prefix(h, 5))}, KvPrefix{10, good.hash ^ 1},
                         KvPrefix{11, KvHash(Prefix(h, 11))}}) {
    auto r = cache_->Append(4, stale, std::span<const uint64_t>(h).subspan(10, 20));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << stale.len;
  }
  // An empty append checks the prefix too.
  EXPECT_EQ(cache_->Append(4, KvPrefix{}, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache_->Info(4)->prefix, good);
  EXPECT_EQ(cache_->BlockTable(4), bt);
  EXPECT_EQ(log_.last_seq(), seq);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 1u);
  EXPECT_EQ(cache_->Stats().append_conflicts, 5u);
  EXPECT_EQ(cache_->Stats().appends, 1u);
  // A user without an entry only accepts the empty prefix.
  EXPECT_EQ(cache_->Append(77, good, Prefix(h, 3)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(cache_->Info(77).has_value());
  EXPECT_TRUE(cache_->Append(4, good, {}).ok());
  ExpectConsistent();
}

TEST_F(KvCacheTest, ConcurrentAppendsOfOneUserExactlyOneWins) {
  Init(64);
  constexpr int kThreads = 4;
  for (int round = 0; round < 300; ++round) {
    const uint64_t user = 1000 + round % 7;
    cache_->Evict(user);
    auto base = Tokens(round, 3);
    MustAppend(user, base, 3);
    const KvPrefix expected{3, KvHash(base)};
    std::vector<std::vector<uint64_t>> mine(kThreads);
    for (int t = 0; t < kThreads; ++t) mine[t] = Tokens(round * 100 + t + 1, 5 + 7 * t);
    std::atomic<int> wins{0}, conflicts{0};
    std::atomic<int> winner{-1};
    std::barrier start(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        auto r = cache_->Append(user, expected, mine[t]);
        if (r.ok()) {
          ++wins;
          winner = t;
          EXPECT_TRUE(cache_->CommitAppend(user, r->prefix).ok());
        } else if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
          ++conflicts;
        }
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_EQ(wins.load(), 1) << "round " << round;
    ASSERT_EQ(conflicts.load(), kThreads - 1) << "round " << round;
    std::vector<uint64_t> full = base;
    full.insert(full.end(), mine[winner].begin(), mine[winner].end());
    KvLookupResult r = cache_->Lookup(user, full);
    ASSERT_EQ(r.prefix, (KvPrefix{full.size(), KvHash(full)})) << "round " << round;
  }
  ExpectConsistent();
}

TEST_F(KvCacheTest, EvictsLeastRecentlyUsedUnderBudget) {
  Init(12);
  cache_->SetBudgetPages(6);
  std::vector<std::vector<uint64_t>> h;
  for (uint64_t u = 0; u <= 6; ++u) h.push_back(Tokens(100 + u, 32));
  for (uint64_t u = 1; u <= 3; ++u) {
    MustAppend(u, h[u], 32);  // 2 pages each
    clock_.AdvanceBy(absl::Seconds(1));
  }
  EXPECT_EQ(cache_->Lookup(1, h[1]).prefix.len, 32u);  // user 1 is now the most recent
  clock_.AdvanceBy(absl::Seconds(1));
  const uint64_t seq = log_.last_seq();
  auto r = MustAppend(4, h[4], 32);
  EXPECT_EQ(r.evicted_users, 1u);
  EXPECT_EQ(cache_->cached_len(2), 0u);
  EXPECT_EQ(cache_->cached_len(1), 32u);
  EXPECT_EQ(cache_->cached_len(3), 32u);
  EXPECT_EQ(EventsSince(seq),
            (std::vector<Ev>{{Kind::kKvEvicted, 2, 0}, {Kind::kKvStored, 4, 32}}));
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 6u);
  EXPECT_EQ(cache_->Stats().evictions_lru, 1u);

  // Pool exhausted by the EMB side while the budget has room: the same LRU rule applies.
  cache_->SetBudgetPages(100);
  while (pool_->AllocPage(PageOwner::kEmb).ok()) {
  }
  clock_.AdvanceBy(absl::Seconds(1));
  r = MustAppend(5, h[5], 32);
  EXPECT_EQ(r.evicted_users, 1u);
  EXPECT_EQ(cache_->cached_len(3), 0u);  // order now: 3, 1, 4
  EXPECT_EQ(cache_->cached_len(1), 32u);
  // Needing 3 pages (one user holds 2) evicts the two coldest.
  auto big = Tokens(106, 48);
  r = MustAppend(6, big, 48);
  EXPECT_EQ(r.evicted_users, 2u);
  EXPECT_EQ(cache_->cached_len(1), 0u);
  EXPECT_EQ(cache_->cached_len(4), 0u);
  EXPECT_EQ(cache_->cached_len(5), 32u);
  // Surplus victim pages went back to the pool.
  EXPECT_EQ(pool_->free_pages(), 1u);
  EXPECT_EQ(cache_->Stats().evictions_lru, 4u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, TouchMakesAUserTheMostRecentlyUsed) {
  Init(12);
  cache_->SetBudgetPages(4);
  const std::vector<uint64_t> a = Tokens(1, 32), b = Tokens(2, 32), c = Tokens(3, 32);
  MustAppend(1, a, 32);
  clock_.AdvanceBy(absl::Seconds(1));
  MustAppend(2, b, 32);
  clock_.AdvanceBy(absl::Seconds(1));
  EXPECT_TRUE(cache_->Touch(1));  // a request of user 1 was admitted
  EXPECT_FALSE(cache_->Touch(9));
  clock_.AdvanceBy(absl::Seconds(1));
  EXPECT_EQ(MustAppend(3, c, 32).evicted_users, 1u);
  EXPECT_EQ(cache_->cached_len(1), 32u);
  EXPECT_EQ(cache_->cached_len(2), 0u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, AppenderIsNeverItsOwnVictim) {
  Init(3);
  auto h1 = Tokens(1, 32);
  MustAppend(1, h1, 16);  // user 1: the least recently used
  clock_.AdvanceBy(absl::Seconds(1));
  MustAppend(2, Tokens(2, 32), 32);
  EXPECT_EQ(pool_->free_pages(), 0u);
  // User 1 grows without a Lookup first, so it is still at the cold end: user 2 goes instead.
  auto r = cache_->Append(1, KvPrefix{16, KvHash(Prefix(h1, 16))},
                          std::span<const uint64_t>(h1).subspan(16));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->evicted_users, 1u);
  ASSERT_TRUE(cache_->CommitAppend(1, r->prefix).ok());
  EXPECT_EQ(cache_->cached_len(1), 32u);
  EXPECT_EQ(cache_->cached_len(2), 0u);
  EXPECT_EQ(cache_->Lookup(1, h1).prefix.len, 32u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, LoweringTheBudgetEvictsNothingButStopsGrowth) {
  Init(12);
  for (uint64_t u = 1; u <= 4; ++u) MustAppend(u, Tokens(u, 32), 32);
  cache_->SetBudgetPages(4);
  EXPECT_EQ(cache_->budget_pages(), 4u);
  EXPECT_EQ(cache_->Stats().pages_held, 8u);
  EXPECT_EQ(cache_->Stats().evictions_lru, 0u);
  MustAppend(5, Tokens(5, 16), 16);  // one page, taken from the LRU user, not from the pool
  EXPECT_EQ(cache_->cached_len(1), 0u);
  EXPECT_EQ(cache_->Stats().pages_held, 7u);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 7u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, PinnedUsersAreNeverEvictedAndFullMeansResourceExhausted) {
  Init(4);
  cache_->Pin(1);
  cache_->Pin(2);
  MustAppend(1, Tokens(1, 32), 32);
  MustAppend(2, Tokens(2, 20), 20);
  EXPECT_EQ(pool_->free_pages(), 0u);
  const uint64_t seq = log_.last_seq();
  auto r = cache_->Append(3, KvPrefix{}, Tokens(3, 5));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(cache_->Info(3).has_value());
  // Growing a pinned user's own KV: it is never its own victim.
  auto h2 = Tokens(2, 40);
  r = cache_->Append(2, KvPrefix{20, KvHash(Prefix(h2, 20))},
                     std::span<const uint64_t>(h2).subspan(20));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache_->cached_len(1), 32u);
  EXPECT_EQ(cache_->cached_len(2), 20u);
  EXPECT_EQ(log_.last_seq(), seq);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 4u);
  EXPECT_EQ(cache_->Stats().append_exhausted, 2u);
  ExpectConsistent();

  // Unpinned, user 2 is evictable by others, still never by itself.
  ASSERT_TRUE(cache_->Unpin(2).ok());
  r = cache_->Append(2, KvPrefix{20, KvHash(Prefix(h2, 20))},
                     std::span<const uint64_t>(h2).subspan(20));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache_->cached_len(2), 20u);
  r = cache_->Append(3, KvPrefix{}, Tokens(3, 5));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(cache_->CommitAppend(3, r->prefix).ok());
  EXPECT_EQ(cache_->cached_len(3), 5u);
  EXPECT_EQ(cache_->cached_len(2), 0u);
  EXPECT_EQ(cache_->cached_len(1), 32u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, FailedAppendReturnsThePagesItTookFromThePool) {
  Init(4);
  cache_->Pin(1);
  MustAppend(1, Tokens(1, 16), 16);
  // Needs 4 pages, 3 are free: none taken, none leaked.
  auto r = cache_->Append(2, KvPrefix{}, Tokens(2, 64));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool_->free_pages(), 3u);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 1u);
  EXPECT_EQ(cache_->Stats().pages_held, 1u);
  ExpectConsistent();
  EXPECT_TRUE(cache_->Append(2, KvPrefix{}, Tokens(2, 48)).ok());
  EXPECT_EQ(pool_->free_pages(), 0u);
}

TEST_F(KvCacheTest, ReclaimTakesWholeUsersThenTailPagesColdestFirst) {
  Init(16);
  auto h1 = Tokens(1, 40), h2 = Tokens(2, 40), h3 = Tokens(3, 32), h4 = Tokens(4, 10);
  MustAppend(1, h1, 40);  // 3 pages
  clock_.AdvanceBy(absl::Seconds(1));
  MustAppend(2, h2, 40);  // 3 pages
  clock_.AdvanceBy(absl::Seconds(1));
  cache_->Pin(3);
  MustAppend(3, h3, 32);  // 2 pages, pinned
  MustAppend(4, h4, 10);  // 1 page
  const uint64_t seq = log_.last_seq();

  std::vector<PageId> bt1 = cache_->BlockTable(1), bt2 = cache_->BlockTable(2);
  std::vector<PageId> got = cache_->Reclaim(5, 10);
  ASSERT_EQ(got.size(), 5u);
  std::vector<PageId> expect = bt1;
  expect.push_back(bt2[1]);
  expect.push_back(bt2[2]);
  EXPECT_EQ(got, expect);
  for (PageId p : got) EXPECT_EQ(pool_->owner(p), PageOwner::kKv);  // the caller's now
  EXPECT_EQ(cache_->Stats().pages_held, 4u);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 9u);
  EXPECT_EQ(EventsSince(seq),
            (std::vector<Ev>{{Kind::kKvEvicted, 1, 0}, {Kind::kKvTruncated, 2, 16}}));
  EXPECT_EQ(cache_->BlockTable(2), std::vector<PageId>{bt2[0]});
  ExpectConsistent();
  for (PageId p : got) pool_->Transfer(p, PageOwner::kKv, PageOwner::kEmb);
  EXPECT_TRUE(pool_->CheckInvariants().ok());

  // The remaining prefix still matches the original history.
  KvLookupResult r = cache_->Lookup(2, h2);
  EXPECT_FALSE(r.evicted_stale);
  EXPECT_EQ(r.prefix, (KvPrefix{16, KvHash(Prefix(h2, 16))}));
  // ... and grows again from there.
  auto grown = cache_->Append(2, r.prefix, std::span<const uint64_t>(h2).subspan(16));
  ASSERT_TRUE(grown.ok());
  EXPECT_TRUE(cache_->CommitAppend(2, grown->prefix).ok());
  EXPECT_EQ(cache_->Lookup(2, h2).prefix.len, 40u);

  // max_users: only the coldest user (4, since 2 was just used) is touched.
  got = cache_->Reclaim(100, 1);
  EXPECT_EQ(got.size(), 1u);
  EXPECT_EQ(cache_->cached_len(4), 0u);
  EXPECT_EQ(cache_->cached_len(2), 40u);
  for (PageId p : got) pool_->FreePage(p);
  // Pinned users are never reclaimed.
  got = cache_->Reclaim(100, 100);
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(cache_->cached_len(3), 32u);
  EXPECT_TRUE(cache_->Reclaim(100, 100).empty());
  EXPECT_TRUE(cache_->Reclaim(0, 100).empty());
  for (PageId p : got) pool_->FreePage(p);
  KvCacheStats s = cache_->Stats();
  EXPECT_EQ(s.evictions_reclaim, 3u);
  EXPECT_EQ(s.truncations_reclaim, 1u);
  EXPECT_EQ(s.pages_reclaimed, 9u);
  EXPECT_EQ(s.pages_held, 2u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, ReclaimTakesOnlyIdleUsers) {
  KvCacheOptions o = SmallOptions();
  o.reclaim_min_idle = absl::Seconds(10);
  Init(8, o);
  MustAppend(1, Tokens(1, 16), 16);
  clock_.AdvanceBy(absl::Seconds(8));
  MustAppend(2, Tokens(2, 16), 16);
  clock_.AdvanceBy(absl::Seconds(4));
  std::vector<PageId> got = cache_->Reclaim(10, 10);
  EXPECT_EQ(got.size(), 1u);
  EXPECT_EQ(cache_->cached_len(1), 0u);
  EXPECT_EQ(cache_->cached_len(2), 16u);
  for (PageId p : got) pool_->FreePage(p);
  ExpectConsistent();
}

TEST_F(KvCacheTest, ExplicitEvictAndUnpinErrors) {
  Init(8);
  EXPECT_FALSE(cache_->Evict(1));
  MustAppend(1, Tokens(1, 20), 20);
  EXPECT_TRUE(cache_->Evict(1));
  EXPECT_FALSE(cache_->Evict(1));
  EXPECT_FALSE(cache_->Info(1).has_value());
  EXPECT_EQ(cache_->Unpin(1).code(), absl::StatusCode::kFailedPrecondition);
  cache_->Pin(1);
  cache_->Pin(1);
  EXPECT_EQ(cache_->Info(1)->pins, 2u);
  EXPECT_EQ(cache_->Stats().pinned_users, 1u);
  MustAppend(1, Tokens(1, 20), 20);
  EXPECT_TRUE(cache_->Evict(1));
  EXPECT_EQ(cache_->Info(1)->retired_pages, 2u);
  EXPECT_TRUE(cache_->Unpin(1).ok());
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 2u);
  EXPECT_TRUE(cache_->Unpin(1).ok());
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 0u);
  EXPECT_FALSE(cache_->Info(1).has_value());  // empty and unpinned: gone
  EXPECT_EQ(cache_->Unpin(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cache_->Stats().evictions_explicit, 2u);
  EXPECT_EQ(cache_->Stats().pinned_users, 0u);
  ExpectConsistent();
}

TEST_F(KvCacheTest, EventsFollowTheOperations) {
  Init(4);
  auto h = Tokens(1, 64);
  MustAppend(1, h, 20);                    // stored 1:20
  MustAppend(1, h, 33);                    // stored 1:33
  MustAppend(2, Tokens(2, 8), 8);          // stored 2:8
  cache_->Lookup(2, Tokens(9, 8));         // evicted 2 (mismatch)
  MustAppend(3, Tokens(3, 16), 16);        // stored 3:16
  auto reclaimed = cache_->Reclaim(1, 1);  // truncated 1:32
  pool_->FreePage(reclaimed[0]);
  MustAppend(4, Tokens(4, 48), 48);  // evicted 1 (lru: 1 page free, 2 needed), stored 4:48
  cache_->Evict(4);                  // evicted 4
  cache_->Evict(4);                  // nothing
  EXPECT_EQ(Events(), (std::vector<Ev>{{Kind::kKvStored, 1, 20},
                                       {Kind::kKvStored, 1, 33},
                                       {Kind::kKvStored, 2, 8},
                                       {Kind::kKvEvicted, 2, 0},
                                       {Kind::kKvStored, 3, 16},
                                       {Kind::kKvTruncated, 1, 32},
                                       {Kind::kKvEvicted, 1, 0},
                                       {Kind::kKvStored, 4, 48},
                                       {Kind::kKvEvicted, 4, 0}}));
  ExpectConsistent();
}

TEST_F(KvCacheTest, DestructorReturnsEveryPage) {
  Init(8);
  cache_->Pin(1);
  MustAppend(1, Tokens(1, 20), 20);
  cache_->Evict(1);  // retired
  MustAppend(1, Tokens(1, 20), 20);
  MustAppend(2, Tokens(2, 40), 40);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kKv), 7u);
  cache_.reset();
  EXPECT_EQ(pool_->free_pages(), 8u);
  EXPECT_TRUE(pool_->CheckInvariants().ok());
}

// Randomised property test: random interleavings of lookup / pin / unpin / append (commit or
// abort) / evict / reclaim / budget changes / EMB page churn / history edits on a small pool backed
// by a host byte array. Appended tokens get a (user, position, token)-derived byte pattern; after
// every step every cached prefix must still hold its pattern, so a page reused while referenced is
// caught, as are wrong hashes, leaked pages and evicted pinned users.
class KvCacheModelTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kPages = 12;
  static constexpr uint64_t kUsers = 6;

  void Reset(uint64_t seed) {
    rng_.seed(seed);
    memory_.assign(kPages * kPageBytes, 0);
    cache_.reset();
    pool_ = *HbmPool::Create({.pool_bytes = kPages * kPageBytes, .page_bytes = kPageBytes});
    log_ = std::make_unique<ResidencyEventLog>(1, 1 << 20);
    cache_ = *KvCache::Create(SmallOptions(), *pool_, log_.get(), clock_);
    hist_.assign(kUsers, {});
    model_.assign(kUsers, {});
    pins_.assign(kUsers, 0);
    emb_.clear();
  }

  static uint8_t Pattern(uint64_t user, uint64_t pos, uint64_t token, uint32_t layer, KvPart part,
                         uint32_t byte) {
    return static_cast<uint8_t>(
        Mix64(KeyedHash(user, pos, token) + layer * 64 + static_cast<uint32_t>(part) * 16 + byte));
  }
  void ForEachByte(uint64_t user, uint64_t pos, uint64_t token, PageId page, uint32_t slot,
                   const std::function<void(uint8_t&, uint8_t)>& fn) {
    const KvPageLayout& l = cache_->layout();
    for (uint32_t layer = 0; layer < l.layers; ++layer) {
      for (KvPart part : {KvPart::kKey, KvPart::kValue}) {
        const uint64_t at = cache_->ByteOffset(page, layer, part, slot);
        for (uint32_t b = 0; b < l.vector_bytes(); ++b) {
          fn(memory_[at + b], Pattern(user, pos, token, layer, part, b));
        }
      }
    }
  }
  void Scribble(PageId page) {
    for (uint64_t b = 0; b < kPageBytes; ++b) memory_[pool_->PageOffset(page) + b] = rng_() & 0xff;
  }
  std::vector<std::optional<KvUserInfo>> Snapshot() {
    std::vector<std::optional<KvUserInfo>> out;
    for (uint64_t u = 0; u < kUsers; ++u) out.push_back(cache_->Info(u));
    return out;
  }
  static bool Same(const std::optional<KvUserInfo>& a, const std::optional<KvUserInfo>& b) {
    if (a.has_value() != b.has_value()) return false;
    return !a || (a->prefix == b->prefix && a->pages == b->pages && a->pins == b->pins &&
                  a->retired_pages == b->retired_pages);
  }

  void DoLookup(uint64_t u) {
    std::vector<uint64_t> h = hist_[u];
    if (rng_() % 5 == 0) h.resize(rng_() % (h.size() + 1));
    auto before = cache_->Info(u);
    KvLookupResult r = cache_->Lookup(u, h);
    if (before && before->prefix.len > 0) {
      const uint64_t c = before->prefix.len;
      const bool match = h.size() >= c && KvHash(Prefix(h, c)) == before->prefix.hash;
      ASSERT_EQ(r.prefix, match ? before->prefix : KvPrefix{});
      ASSERT_EQ(r.evicted_stale, !match);
    } else {
      ASSERT_EQ(r.prefix, KvPrefix{});
    }
    if (r.prefix.len > 0) {
      ++hits_;
      std::vector<PageId> bt = cache_->BlockTable(u);
      bt.resize((r.prefix.len + kPt - 1) / kPt);
      ASSERT_EQ(r.pages, bt);
    }
  }

  void DoAppend(uint64_t u) {
    KvPrefix p = cache_->Lookup(u, hist_[u]).prefix;
    const size_t k = 1 + rng_() % 40;
    while (hist_[u].size() < p.len + k) hist_[u].push_back(rng_());
    auto tokens = std::span<const uint64_t>(hist_[u]).subspan(p.len, k);
    KvPrefix expected = p;
    const bool stale = rng_() % 10 == 0;
    if (stale && rng_() % 2) {
      expected.len += 1 + rng_() % 3;
    } else if (stale) {
      expected.hash ^= 1;
    }
    // What the cache must be able to do: free pool pages within the budget plus every page of
    // unpinned users other than u.
    const auto before = Snapshot();
    const KvCacheStats stats = cache_->Stats();
    uint64_t victims = 0;
    for (uint64_t v = 0; v < kUsers; ++v) {
      if (v != u && before[v] && before[v]->pins == 0) victims += before[v]->pages;
    }
    const uint64_t n = (p.len + k + kPt - 1) / kPt - (p.len + kPt - 1) / kPt;
    const uint64_t room =
        stats.budget_pages > stats.pages_held ? stats.budget_pages - stats.pages_held : 0;
    const bool fits = n <= std::min<uint64_t>(room, pool_->free_pages()) + victims;
    const uint32_t kv_pages = pool_->pages_owned(PageOwner::kKv);

    auto r = cache_->Append(u, expected, tokens);
    if (stale || !fits) {
      ASSERT_EQ(r.status().code(), stale ? absl::StatusCode::kFailedPrecondition
                                         : absl::StatusCode::kResourceExhausted)
          << r.status();
      const auto after = Snapshot();
      for (uint64_t v = 0; v < kUsers; ++v) ASSERT_TRUE(Same(before[v], after[v])) << v;
      ASSERT_EQ(pool_->pages_owned(PageOwner::kKv), kv_pages);
      ++(stale ? stale_ : failed_);
      return;
    }
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->prefix, (KvPrefix{p.len + k, KvHash(Prefix(hist_[u], p.len + k))}));
    std::vector<PageId> bt = cache_->BlockTable(u);
    uint64_t pos = p.len;
    for (const KvSlotRun& run : r->runs) {
      ASSERT_EQ(run.first_slot, pos % kPt);
      ASSERT_LE(run.first_slot + run.tokens, kPt);
      ASSERT_LT(pos / kPt, bt.size());
      ASSERT_EQ(run.page, bt[pos / kPt]);
      for (uint32_t i = 0; i < run.tokens; ++i, ++pos) {
        ForEachByte(u, pos, hist_[u][pos], run.page, run.first_slot + i,
                    [](uint8_t& at, uint8_t want) { at = want; });
      }
    }
    ASSERT_EQ(pos, p.len + k);
    const KvCacheStats after = cache_->Stats();
    ASSERT_LE(after.pages_held, std::max<uint64_t>(stats.budget_pages, stats.pages_held));
    ASSERT_EQ(after.pages_held, pool_->pages_owned(PageOwner::kKv));
    if (rng_() % 8 == 0) {
      ASSERT_TRUE(cache_->AbortAppend(u, r->prefix).ok());
      return;
    }
    if (rng_() % 8 == 0) DoLookup(u);  // may drop the KV before the commit
    absl::Status commit = cache_->CommitAppend(u, r->prefix);
    if (commit.ok()) {
      model_[u].assign(hist_[u].begin(), hist_[u].begin() + p.len + k);
      ++appends_;
    } else {
      ASSERT_EQ(commit.code(), absl::StatusCode::kAborted) << commit;
    }
  }

  void DoReclaim() {
    const uint32_t max_pages = rng_() % 6, max_users = rng_() % 3;
    const auto before = Snapshot();
    std::vector<PageId> got = cache_->Reclaim(max_pages, max_users);
    ASSERT_LE(got.size(), max_pages);
    const auto after = Snapshot();
    uint32_t touched = 0;
    for (uint64_t v = 0; v < kUsers; ++v) {
      if (Same(before[v], after[v])) continue;
      ++touched;
      ASSERT_EQ(before[v]->pins, 0u);
      if (after[v]) {
        ASSERT_EQ(after[v]->prefix.len % kPt, 0u);
      }
    }
    ASSERT_LE(touched, max_users);
    for (PageId p : got) {
      ASSERT_EQ(pool_->owner(p), PageOwner::kKv);
      pool_->Transfer(p, PageOwner::kKv, PageOwner::kEmb);
      Scribble(p);
      emb_.push_back(p);
    }
  }

  void Step() {
    const uint64_t u = rng_() % kUsers;
    const uint64_t op = rng_() % 100;
    if (op < 20) {
      DoLookup(u);
    } else if (op < 50) {
      DoAppend(u);
    } else if (op < 54) {
      cache_->Pin(u);
      ++pins_[u];
    } else if (op < 66) {
      if (pins_[u] > 0) {
        ASSERT_TRUE(cache_->Unpin(u).ok());
        --pins_[u];
      } else {
        ASSERT_EQ(cache_->Unpin(u).code(), absl::StatusCode::kFailedPrecondition);
      }
    } else if (op < 69) {
      auto before = cache_->Info(u);
      ASSERT_EQ(cache_->Evict(u), before && before->prefix.len > 0);
    } else if (op < 74) {
      DoReclaim();
    } else if (op < 78) {  // the EMB side takes a free page
      absl::StatusOr<PageId> p = pool_->AllocPage(PageOwner::kEmb);
      if (p.ok()) {
        Scribble(*p);
        emb_.push_back(*p);
      }
    } else if (op < 89) {  // ... or gives some back
      for (uint64_t n = 1 + rng_() % 4; n > 0 && !emb_.empty(); --n) {
        size_t i = rng_() % emb_.size();
        pool_->FreePage(emb_[i]);
        emb_[i] = emb_.back();
        emb_.pop_back();
      }
    } else if (op < 93) {
      cache_->SetBudgetPages(2 + rng_() % (kPages + 2));
    } else if (op < 97) {
      auto& h = hist_[u];
      if (h.empty()) return;
      if (rng_() % 2) {
        h[rng_() % h.size()] ^= 1 + rng_() % 255;
      } else {  // the history window slides: its front is trimmed by 10 %
        h.erase(h.begin(), h.begin() + std::max<size_t>(1, h.size() / 10));
      }
    } else {
      clock_.AdvanceBy(absl::Seconds(rng_() % 3));
    }
    if (hist_[u].size() > 120) hist_[u].erase(hist_[u].begin(), hist_[u].begin() + 40);
  }

  void CheckAll(const std::vector<std::optional<KvUserInfo>>& before) {
    ASSERT_TRUE(pool_->CheckInvariants().ok()) << pool_->CheckInvariants();
    ASSERT_TRUE(cache_->CheckInvariants().ok()) << cache_->CheckInvariants();
    const KvCacheStats stats = cache_->Stats();
    ASSERT_EQ(stats.pages_held, pool_->pages_owned(PageOwner::kKv));
    ASSERT_EQ(emb_.size(), pool_->pages_owned(PageOwner::kEmb));
    for (uint64_t u = 0; u < kUsers; ++u) {
      auto info = cache_->Info(u);
      if (pins_[u] > 0) {
        ASSERT_TRUE(info.has_value()) << "pinned user " << u << " lost its entry";
        ASSERT_EQ(info->pins, pins_[u]);
      }
      // A pinned user's KV only changes through operations on that user.
      if (before[u] && before[u]->pins > 0 && before[u]->pins == pins_[u] && info &&
          last_user_ != u) {
        ASSERT_EQ(info->prefix, before[u]->prefix) << u;
      }
      const uint64_t len = info ? info->prefix.len : 0;
      if (info) {
        ASSERT_LE(len, uint64_t{info->pages} * kPt);
        ASSERT_FALSE(info->append_in_flight);
      }
      // The cached prefix is always a prefix of what was committed, hash and bytes included.
      ASSERT_LE(len, model_[u].size()) << u;
      model_[u].resize(len);
      if (info) {
        ASSERT_EQ(info->prefix.hash, KvHash(model_[u])) << u;
      }
      std::vector<PageId> bt = cache_->BlockTable(u);
      uint64_t wrong = 0;
      for (uint64_t j = 0; j < len; ++j) {
        ForEachByte(u, j, model_[u][j], bt[j / kPt], j % kPt,
                    [&](uint8_t& at, uint8_t want) { wrong += at != want; });
      }
      ASSERT_EQ(wrong, 0u) << "user " << u << " len " << len;
    }
  }

  Rng rng_;
  SimClock clock_;
  std::vector<uint8_t> memory_;
  std::unique_ptr<ResidencyEventLog> log_;
  std::unique_ptr<HbmPool> pool_;
  std::unique_ptr<KvCache> cache_;
  std::vector<std::vector<uint64_t>> hist_, model_;
  std::vector<uint32_t> pins_;
  std::vector<PageId> emb_;
  uint64_t last_user_ = 0;
  uint64_t hits_ = 0, appends_ = 0, failed_ = 0, stale_ = 0;
};

TEST_F(KvCacheModelTest, RandomInterleavingsKeepInvariants) {
  constexpr uint64_t kSeeds = 16;
  constexpr int kSteps = 2500;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::cout << "[ seed     ] " << seed << "\n";
    Reset(seed);
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE(testing::Message() << "step " << step);
      const auto before = Snapshot();
      Rng peek = rng_;
      last_user_ = peek() % kUsers;  // the user Step() is about to pick
      Step();
      ASSERT_FALSE(HasFatalFailure());
      CheckAll(before);
      ASSERT_FALSE(HasFatalFailure());
    }
    // The log holds exactly the published changes: replaying it gives each user's length.
    std::vector<uint64_t> replay(kUsers, 0);
    for (const ResidencyEvent& e : EventsFrom(*log_, 0)) replay[e.user_id] = e.tokens;
    for (uint64_t u = 0; u < kUsers; ++u) EXPECT_EQ(replay[u], cache_->cached_len(u)) << u;
    KvCacheStats s = cache_->Stats();
    EXPECT_GT(s.evictions_lru + s.evictions_reclaim + s.truncations_reclaim, 0u);
    EXPECT_GT(s.evictions_mismatch, 0u);
  }
  // The walk exercised every outcome.
  std::cout << "[ walk     ] hits " << hits_ << " commits " << appends_ << " stale appends "
            << stale_ << " appends without room " << failed_ << "\n";
  EXPECT_GT(stale_, 100u);
  EXPECT_GT(hits_, 1000u);
  EXPECT_GT(appends_, 2000u);
  EXPECT_GT(failed_, 500u);
}

// Several threads run the request protocol over overlapping users while another moves the budget
// and reclaims; each request checks the bytes of the prefix it was given. Meant for TSan too.
TEST(KvCacheConcurrencyTest, RequestsReclaimAndBudgetChangesInParallel) {
  constexpr uint32_t kPages = 24;
  constexpr uint64_t kUsers = 10;
  // Plain bytes: under TSan a request reading K/V that another one is writing is a reported race.
  std::vector<uint8_t> memory(kPages * kPageBytes);
  SimClock clock;
  ResidencyEventLog log(1, 1 << 16);
  auto pool = *HbmPool::Create({.pool_bytes = kPages * kPageBytes, .page_bytes = kPageBytes});
  auto cache = *KvCache::Create(SmallOptions(), *pool, &log, clock);
  // A user's history is a fixed token stream, or (variant 1) the same stream with token 0 edited.
  auto token = [](uint64_t user, uint64_t variant, uint64_t j) {
    return KeyedHash(user, j == 0 ? variant : 0, j);
  };
  auto byte_of = [](uint64_t user, uint64_t tok, uint64_t j, uint64_t at) {
    return static_cast<uint8_t>(KeyedHash(user, tok, j, at));
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hits{0}, corrupt{0}, commits{0};
  auto worker = [&](uint64_t seed) {
    Rng rng(seed);
    for (int i = 0; i < 3000; ++i) {
      const uint64_t u = rng() % kUsers, variant = rng() % 8 == 0;
      std::vector<uint64_t> h(16 + rng() % 64);
      for (uint64_t j = 0; j < h.size(); ++j) h[j] = token(u, variant, j);
      cache->Pin(u);
      KvLookupResult r = cache->Lookup(u, h);
      for (uint64_t j = 0; j < r.prefix.len; ++j) {
        const uint64_t at = cache->ByteOffset(r.pages[j / kPt], 1, KvPart::kValue, j % kPt);
        if (memory[at] != byte_of(u, h[j], j, 0)) ++corrupt;
      }
      hits += r.prefix.len > 0;
      if (r.prefix.len < h.size()) {
        auto a = cache->Append(u, r.prefix, std::span<const uint64_t>(h).subspan(r.prefix.len));
        if (a.ok()) {
          uint64_t j = r.prefix.len;
          for (const KvSlotRun& run : a->runs) {
            for (uint32_t s = 0; s < run.tokens; ++s, ++j) {
              const uint64_t at =
                  cache->ByteOffset(run.page, 1, KvPart::kValue, run.first_slot + s);
              memory[at] = byte_of(u, h[j], j, 0);
            }
          }
          if (cache->CommitAppend(u, a->prefix).ok()) ++commits;
        }
      }
      EXPECT_TRUE(cache->Unpin(u).ok());
    }
  };
  std::thread churn([&] {
    Rng rng(99);
    while (!stop) {
      cache->SetBudgetPages(8 + rng() % (kPages - 8));
      for (PageId p : cache->Reclaim(rng() % 3, 2)) {
        pool->Transfer(p, PageOwner::kKv, PageOwner::kEmb);
        pool->FreePage(p);
      }
      clock.AdvanceBy(absl::Milliseconds(1));
    }
  });
  std::vector<std::thread> workers;
  for (uint64_t t = 0; t < 3; ++t) workers.emplace_back(worker, t + 1);
  for (auto& w : workers) w.join();
  stop = true;
  churn.join();
  EXPECT_EQ(corrupt.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
  EXPECT_GT(commits.load(), 0u);
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  EXPECT_TRUE(pool->CheckInvariants().ok());
  EXPECT_EQ(cache->Stats().pinned_users, 0u);
  EXPECT_EQ(cache->Stats().pages_held, pool->pages_owned(PageOwner::kKv));
}

}  // namespace
}  // namespace hlem::serving
