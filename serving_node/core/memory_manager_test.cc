#include "serving_node/core/memory_manager.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "serving_node/core/window_stats.h"
#include "serving_node/device/cpu_device.h"

namespace hlem::serving {
namespace {

constexpr uint64_t kPageBytes = 4096;
constexpr uint32_t kPages = 100;

// A pool whose bytes live in a CpuDevice, a KV cache (1 layer, 64 B vectors, fp32: 32 tokens a
// page), an EMB cache of 256 B rows, and the manager, all on one simulated clock.
class MemoryManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(MemoryManagerOptions{}); }

  void Build(MemoryManagerOptions options) {
    manager_.reset();
    emb_.reset();
    kv_.reset();
    pool_ = *HbmPool::Create({.pool_bytes = kPages * kPageBytes, .page_bytes = kPageBytes});
    device_ = *CpuDevice::Create(
        {.pool_bytes = kPages * kPageBytes, .link = {.bytes_per_second = 1e12, .latency = {}}},
        clock_);
    kv_ = *KvCache::Create({.layers = 1, .kv_dim = 16, .dtype_bytes = 4}, *pool_, &events_, clock_);
    emb_ = *EmbCache::Create({.tables = {{.table_id = 0, .row_bytes = 256}}}, *pool_, clock_);
    manager_ = *MemoryManager::Create(options, *pool_, *kv_, *emb_, clock_);
  }

  // Appends `tokens` tokens for `user`, writing each token's K and V through the device (purpose
  // kKv) with a user/position pattern, and commits.
  absl::Status Grow(uint64_t user, uint32_t tokens) {
    std::vector<uint64_t> history(kv_->cached_len(user));
    for (size_t i = 0; i < history.size(); ++i) history[i] = Token(user, i);
    KvLookupResult lookup = kv_->Lookup(user, history);
    std::vector<uint64_t> fresh(tokens);
    for (uint32_t i = 0; i < tokens; ++i) fresh[i] = Token(user, lookup.prefix.len + i);
    auto append = kv_->Append(user, lookup.prefix, fresh);
    if (!append.ok()) return append.status();
    uint64_t pos = lookup.prefix.len;
    for (const KvSlotRun& run : append->runs) {
      for (uint32_t t = 0; t < run.tokens; ++t, ++pos) {
        for (KvPart part : {KvPart::kKey, KvPart::kValue}) {
          auto bytes = std::make_shared<std::vector<std::byte>>(kv_->layout().vector_bytes());
          Fill(*bytes, user, pos, part);
          device_->CopyToPool(CopyClass::kCritical, CopyPurpose::kKv, bytes->data(),
                              kv_->ByteOffset(run.page, 0, part, run.first_slot + t), bytes->size(),
                              [bytes](absl::Status) {});
        }
      }
    }
    clock_.AdvanceBy(absl::Microseconds(1));  // the emulated link delivers the copies
    return kv_->CommitAppend(user, append->prefix);
  }

  // True when every cached token of `user` still holds its pattern.
  bool KvBytesIntact(uint64_t user) {
    const uint64_t len = kv_->cached_len(user);
    std::vector<PageId> table = kv_->BlockTable(user);
    std::vector<std::byte> got(kv_->layout().vector_bytes()), want(got.size());
    for (uint64_t pos = 0; pos < len; ++pos) {
      for (KvPart part : {KvPart::kKey, KvPart::kValue}) {
        uint64_t off =
            kv_->ByteOffset(table[pos / kv_->page_tokens()], 0, part, pos % kv_->page_tokens());
        if (!device_->ReadPool(off, got.data(), got.size()).ok()) return false;
        Fill(want, user, pos, part);
        if (got != want) return false;
      }
    }
    return true;
  }

  static uint64_t Token(uint64_t user, uint64_t pos) { return KeyedHash(user, pos); }
  static void Fill(std::vector<std::byte>& b, uint64_t user, uint64_t pos, KvPart part) {
    for (size_t i = 0; i < b.size(); ++i) {
      b[i] = std::byte(KeyedHash(user, pos, static_cast<int>(part), i) & 0xff);
    }
  }
  void FillEmb(uint32_t rows) {
    for (uint64_t r = 0; r < rows; ++r) (void)emb_->Insert(0, r);
  }
  uint64_t KvCopies() { return device_->stats().copies[static_cast<int>(CopyPurpose::kKv)]; }

  SimClock clock_;
  ResidencyEventLog events_{1, 1 << 16};
  std::unique_ptr<HbmPool> pool_;
  std::unique_ptr<CpuDevice> device_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<EmbCache> emb_;
  std::unique_ptr<MemoryManager> manager_;
};

TEST_F(MemoryManagerTest, RejectsBadAlphaAndStaleEpochs) {
  EXPECT_EQ(manager_->SetAlpha(-0.1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->SetAlpha(1.5, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->SetAlpha(std::nan(""), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(manager_->SetAlpha(0.3, 5).ok());
  EXPECT_TRUE(manager_->SetAlpha(0.3, 5).ok());  // the same push again
  auto stale = manager_->SetAlpha(0.9, 4);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_DOUBLE_EQ(manager_->State().target_alpha, 0.3);
  EXPECT_EQ(manager_->State().alpha_epoch, 5u);
  EXPECT_FALSE(MemoryManager::Create({.initial_alpha = 2}, *pool_, *kv_, *emb_, clock_).ok());
}

TEST_F(MemoryManagerTest, BudgetsAddUpToThePool) {
  auto s = *manager_->SetAlpha(0.25, 1);
  EXPECT_EQ(s.emb_budget_pages, 25u);
  EXPECT_EQ(s.kv_budget_pages, 75u);
  EXPECT_TRUE(s.converged);
  EXPECT_DOUBLE_EQ(s.effective_alpha, 0.25);
}

TEST_F(MemoryManagerTest, AlphaDownShedsColdEmbPagesAtOnceWithoutCopyingKv) {
  ASSERT_TRUE(manager_->SetAlpha(0.6, 1).ok());
  FillEmb(60 * 16);  // 16 rows of 256 B per 4 KiB page: 60 pages
  for (uint64_t u = 0; u < 10; ++u) ASSERT_TRUE(Grow(u, 100).ok());  // 4 pages each
  ASSERT_EQ(pool_->pages_owned(PageOwner::kEmb), 60u);
  const uint64_t kv_copies = KvCopies();
  auto s = *manager_->SetAlpha(0.2, 2);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kEmb), 20u);  // metadata: no Step needed
  EXPECT_EQ(s.kv_budget_pages, 80u);
  EXPECT_TRUE(s.converged);
  EXPECT_EQ(s.pages_shrunk, 40u);
  EXPECT_EQ(KvCopies(), kv_copies);  // an α change copies no KV byte
  for (uint64_t u = 0; u < 10; ++u) EXPECT_TRUE(KvBytesIntact(u)) << u;
  EXPECT_TRUE(pool_->CheckInvariants().ok());
  // The shrunk pages' residency counts are left pending; the next Step subtracts them.
  EXPECT_TRUE(emb_->DrainPending(0));
  manager_->Step();
  EXPECT_FALSE(emb_->DrainPending(0));
}

TEST_F(MemoryManagerTest, AlphaUpReclaimsIdleKvAtABoundedRateAndNeverFromPinnedUsers) {
  Build({.initial_alpha = 0.0, .reclaim_pages_per_step = 5, .reclaim_users_per_step = 4});
  for (uint64_t u = 0; u < 25; ++u) ASSERT_TRUE(Grow(u, 128).ok());  // 4 pages each: all 100
  ASSERT_EQ(kv_->page_tokens(), 32u);
  ASSERT_EQ(pool_->free_pages(), 0u);
  kv_->Pin(3);
  kv_->Pin(17);
  const uint64_t kv_copies = KvCopies();
  auto s = *manager_->SetAlpha(0.5, 1);
  EXPECT_FALSE(s.converged);
  EXPECT_DOUBLE_EQ(s.effective_alpha, 0.0);
  EXPECT_EQ(s.kv_budget_pages, 50u);
  int steps = 0;
  while (!manager_->State().converged && steps < 100) {
    uint32_t moved = manager_->Step();
    EXPECT_LE(moved, 5u);
    clock_.AdvanceBy(absl::Milliseconds(10));
    ++steps;
  }
  s = manager_->State();
  EXPECT_TRUE(s.converged);
  EXPECT_EQ(steps, 10);  // 50 pages at 5 per step
  EXPECT_EQ(s.pages_reclaimed, 50u);
  EXPECT_EQ(s.last_convergence, absl::Milliseconds(90));
  EXPECT_EQ(kv_->cached_len(3), 128u);  // pinned users keep everything
  EXPECT_EQ(kv_->cached_len(17), 128u);
  EXPECT_TRUE(KvBytesIntact(3));
  EXPECT_TRUE(KvBytesIntact(17));
  EXPECT_EQ(KvCopies(), kv_copies);
  // The EMB side can now fill its half.
  FillEmb(50 * 16);
  EXPECT_EQ(pool_->pages_owned(PageOwner::kEmb), 50u);
  EXPECT_LE(pool_->pages_owned(PageOwner::kKv), 50u);
  EXPECT_TRUE(pool_->CheckInvariants().ok());
}

TEST_F(MemoryManagerTest, TimerDrivenStepsConvergeOnTheClock) {
  Build(
      {.initial_alpha = 0.0, .reclaim_pages_per_step = 10, .step_interval = absl::Milliseconds(5)});
  for (uint64_t u = 0; u < 25; ++u) ASSERT_TRUE(Grow(u, 128).ok());
  manager_->Start();
  ASSERT_TRUE(manager_->SetAlpha(0.4, 1).ok());
  clock_.AdvanceBy(absl::Milliseconds(100));
  MemoryState s = manager_->State();
  EXPECT_TRUE(s.converged);
  EXPECT_EQ(s.last_convergence, absl::Milliseconds(20));  // 4 steps of 10 pages, 5 ms apart
  manager_->Stop();
}

TEST_F(MemoryManagerTest, WindowCountersSampleTheRealSources) {
  WindowAggregator windows;
  windows.Start(ReadMemoryCounters(*kv_, *emb_, *manager_, nullptr, *device_, clock_.Now()));
  for (uint64_t u = 0; u < 4; ++u) ASSERT_TRUE(Grow(u, 40).ok());  // 4 lookups, all cold
  std::vector<uint64_t> history(40);
  for (size_t i = 0; i < history.size(); ++i) history[i] = Token(1, i);
  kv_->Lookup(1, history);  // a returning user: 40 of 40 tokens reused
  FillEmb(16);
  EmbLookupResult r;
  std::vector<uint64_t> rows = {0, 1, 2, 100};  // 3 hits, 1 miss
  ASSERT_TRUE(emb_->Lookup(0, rows, &r).ok());
  clock_.AdvanceBy(absl::Seconds(5));
  MemoryWindow w =
      windows.Close(ReadMemoryCounters(*kv_, *emb_, *manager_, nullptr, *device_, clock_.Now()));
  EXPECT_EQ(w.kv_requests, 5u);
  EXPECT_DOUBLE_EQ(w.kv_user_hit_rate, 1.0 / 5);
  EXPECT_DOUBLE_EQ(w.kv_hit_rate, 1.0);  // Grow looked up empty prefixes: 40 of 40 tokens
  EXPECT_DOUBLE_EQ(w.emb_hit_rate, 3.0 / 4);
  EXPECT_EQ(w.kv_bytes, uint64_t{pool_->pages_owned(PageOwner::kKv)} * kPageBytes);
  EXPECT_EQ(w.emb_bytes, uint64_t{pool_->pages_owned(PageOwner::kEmb)} * kPageBytes);
  EXPECT_DOUBLE_EQ(w.alpha_target, 0.5);
  EXPECT_GT(w.link_utilisation, 0.0);  // the KV copies crossed the emulated link
}

TEST_F(MemoryManagerTest, RandomAlphaChangesKeepBudgetsAndKvBytes) {
  const uint64_t seed = 20261129;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Build({.initial_alpha = 0.5, .reclaim_pages_per_step = 7, .reclaim_users_per_step = 3});
  std::mt19937_64 rng(seed);
  const uint64_t kv_copies_at_start = KvCopies();
  uint64_t kv_copies_by_appends = 0;
  for (int step = 0; step < 3000; ++step) {
    switch (rng() % 6) {
      case 0: {
        const uint64_t before = KvCopies();
        ASSERT_TRUE(manager_->SetAlpha((rng() % 101) / 100.0, step).ok());
        ASSERT_EQ(KvCopies(), before) << "an alpha change copied KV bytes";
        break;
      }
      case 1:
      case 2: {
        const uint64_t before = KvCopies();
        absl::Status s = Grow(rng() % 40, 1 + rng() % 40);
        ASSERT_TRUE(s.ok() || absl::IsResourceExhausted(s)) << s;
        kv_copies_by_appends += KvCopies() - before;
        break;
      }
      case 3:
        (void)emb_->Insert(0, rng() % 4000);
        break;
      case 4:
        manager_->Step();
        break;
      case 5:
        if (rng() % 2) {
          kv_->Pin(rng() % 40);
        } else {
          (void)kv_->Unpin(rng() % 40);
        }
        break;
    }
    ASSERT_TRUE(pool_->CheckInvariants().ok()) << step;
    MemoryState s = manager_->State();
    const uint32_t target_emb = static_cast<uint32_t>(std::lround(s.target_alpha * kPages));
    ASSERT_EQ(s.kv_budget_pages, kPages - target_emb) << step;  // KV never grows into EMB's share
    ASSERT_LE(s.emb_budget_pages, target_emb) << step;
    ASSERT_LE(s.emb_pages, std::lround(s.target_alpha * kPages)) << step;
    if (step % 100 == 0) {
      for (uint64_t u = 0; u < 40; ++u) ASSERT_TRUE(KvBytesIntact(u)) << "user " << u;
    }
  }
  EXPECT_EQ(KvCopies() - kv_copies_at_start, kv_copies_by_appends);
  for (int i = 0; i < 200 && !manager_->State().converged; ++i) {
    for (uint64_t u = 0; u < 40; ++u) {
      while (kv_->Unpin(u).ok()) {
      }
    }
    manager_->Step();
  }
  MemoryState s = manager_->State();
  EXPECT_TRUE(s.converged);
  EXPECT_LE(s.kv_pages, s.kv_budget_pages);
  EXPECT_TRUE(kv_->CheckInvariants().ok());
  EXPECT_TRUE(emb_->CheckInvariants().ok());
}

}  // namespace
}  // namespace hlem::serving
