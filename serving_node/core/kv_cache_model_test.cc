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

using namespace ::hlem::serving::kv_testing;  // NOLINT: the shared helpers

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
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::cout << "[ seed     ] " << seed << "\n";
    Reset(seed);
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
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
