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
#include "serving_node/core/kv_cache_testing.h"

namespace hlem::serving {
namespace {

using Kind = ResidencyEvent::Kind;

using namespace ::hlem::serving::kv_testing;  // NOLINT: the shared helpers

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

TEST_F(KvCacheTest, AppendHashedIsAppendWithTheHashesGiven) {
  Init(8);
  auto h = Tokens(7, 40);
  // User 1 by tokens; user 2 by the same tokens' hashes: page starts 16 and 32 of [10, 35).
  MustAppend(1, h, 10);
  MustAppend(2, h, 10);
  const KvPrefix at10{10, KvHash(Prefix(h, 10))};
  const KvPrefix at35{35, KvHash(Prefix(h, 35))};
  const std::vector<uint64_t> starts = {KvHash(Prefix(h, 16)), KvHash(Prefix(h, 32))};
  auto by_tokens = cache_->Append(1, at10, std::span<const uint64_t>(h).subspan(10, 25));
  ASSERT_TRUE(by_tokens.ok()) << by_tokens.status();
  // Mismatched hashes or lengths: INVALID_ARGUMENT naming both, and nothing changes.
  for (const auto& [target, page_starts] : std::vector<std::pair<KvPrefix, std::vector<uint64_t>>>{
           {at35, {starts[0]}}, {at35, {starts[0], starts[1], 0}}, {{5, 0}, {}}}) {
    auto bad = cache_->AppendHashed(2, at10, target, page_starts);
    ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
    EXPECT_NE(bad.status().message().find("page-start hashes"), std::string::npos);
    EXPECT_FALSE(cache_->Info(2)->append_in_flight);
  }
  auto by_hashes = cache_->AppendHashed(2, at10, at35, starts);
  ASSERT_TRUE(by_hashes.ok()) << by_hashes.status();
  EXPECT_EQ(by_hashes->prefix, by_tokens->prefix);
  ASSERT_EQ(by_hashes->runs.size(), by_tokens->runs.size());
  for (size_t i = 0; i < by_tokens->runs.size(); ++i) {
    EXPECT_EQ(by_hashes->runs[i].first_slot, by_tokens->runs[i].first_slot);
    EXPECT_EQ(by_hashes->runs[i].tokens, by_tokens->runs[i].tokens);
  }
  ASSERT_TRUE(cache_->CommitAppend(1, by_tokens->prefix).ok());
  ASSERT_TRUE(cache_->CommitAppend(2, by_hashes->prefix).ok());
  EXPECT_EQ(cache_->Lookup(2, h).prefix, at35);
  clock_.AdvanceBy(absl::Seconds(1));
  EXPECT_EQ(cache_->Lookup(1, h).prefix, at35);
  clock_.AdvanceBy(absl::Seconds(1));
  // Truncations (of the colder user 2) take the prefix hash from the page-start hashes given.
  ASSERT_EQ(cache_->Reclaim(1, 8).size(), 1u);
  EXPECT_EQ(cache_->Info(2)->prefix, (KvPrefix{32, starts[1]}));
  ASSERT_EQ(cache_->Reclaim(1, 8).size(), 1u);
  EXPECT_EQ(cache_->Info(2)->prefix, (KvPrefix{16, starts[0]}));
  EXPECT_EQ(cache_->Info(1)->prefix, at35);
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

}  // namespace
}  // namespace hlem::serving
