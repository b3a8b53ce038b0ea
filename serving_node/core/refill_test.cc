#include "serving_node/core/refill.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "gtest/gtest.h"
#include "serving_node/core/emulated_link.h"
#include "serving_node/device/cpu_device.h"

namespace hlem::serving {
namespace {

constexpr uint32_t kRowBytes = 256;
constexpr uint64_t kRefillPageBytes = 64 << 10;  // 256 rows a page
constexpr uint32_t kRefillPages = 64;
constexpr LinkOptions kLink{.bytes_per_second = 1e9, .latency = absl::Microseconds(2)};

std::byte Pattern(uint32_t table, uint64_t row, uint32_t i) {
  return static_cast<std::byte>(KeyedHash(table, row, i / 8) >> (8 * (i % 8)));
}

// Serves every row as its pattern; can be told to fail.
class FakeRowSource final : public RowSource {
 public:
  absl::Status Fetch(uint32_t table_id, std::span<const uint64_t> rows, std::span<std::byte> out,
                     absl::Time /*deadline*/) override {
    ++fetches;
    if (fail) return absl::UnavailableError("shard down");
    const size_t row_bytes = out.size() / rows.size();
    for (size_t r = 0; r < rows.size(); ++r) {
      for (size_t i = 0; i < row_bytes; ++i) {
        out[r * row_bytes + i] = Pattern(table_id, rows[r], static_cast<uint32_t>(i));
      }
      fetched.insert(rows[r]);
    }
    return absl::OkStatus();
  }
  bool fail = false;
  int fetches = 0;
  absl::flat_hash_set<uint64_t> fetched;
};

// A CpuDevice whose background copies can be made to fail.
class FlakyDevice final : public Device {
 public:
  explicit FlakyDevice(Device& inner) : inner_(inner) {}
  std::string name() const override { return "flaky"; }
  uint64_t pool_bytes() const override { return inner_.pool_bytes(); }
  void CopyToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src, uint64_t pool_offset,
                  size_t bytes, std::function<void(absl::Status)> done) override {
    if (fail_background && cls == CopyClass::kBackground) {
      done(absl::UnavailableError("copy failed"));
      return;
    }
    inner_.CopyToPool(cls, purpose, src, pool_offset, bytes, std::move(done));
  }
  void CopyToBuffer(CopyClass cls, CopyPurpose purpose, const std::byte* src, DeviceBuffer& dst,
                    size_t offset, size_t bytes, std::function<void(absl::Status)> done) override {
    inner_.CopyToBuffer(cls, purpose, src, dst, offset, bytes, std::move(done));
  }
  absl::Status ReadPool(uint64_t off, std::byte* dst, size_t bytes) override {
    return inner_.ReadPool(off, dst, bytes);
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocBuffer(size_t bytes) override {
    return inner_.AllocBuffer(bytes);
  }
  absl::Status WriteBuffer(DeviceBuffer& dst, size_t off, const std::byte* src,
                           size_t bytes) override {
    return inner_.WriteBuffer(dst, off, src, bytes);
  }
  absl::Status ReadBuffer(const DeviceBuffer& src, size_t off, std::byte* dst,
                          size_t bytes) override {
    return inner_.ReadBuffer(src, off, dst, bytes);
  }
  absl::Status GatherRows(std::span<const uint64_t> offsets, uint32_t row_bytes,
                          DeviceBuffer& dst) override {
    return inner_.GatherRows(offsets, row_bytes, dst);
  }
  absl::Status SumRows(std::span<const uint64_t> sources, uint32_t per_token, uint32_t dim,
                       const DeviceBuffer* extra, DeviceBuffer& dst) override {
    return inner_.SumRows(sources, per_token, dim, extra, dst);
  }
  absl::Status ScatterKv(const KvGeometry& g, std::span<const uint64_t> page_offsets,
                         std::span<const uint32_t> slots, const DeviceBuffer& src) override {
    return inner_.ScatterKv(g, page_offsets, slots, src);
  }
  absl::Status Synchronize() override { return inner_.Synchronize(); }
  bool critical_pending() const override { return inner_.critical_pending(); }
  DeviceCopyStats stats() const override { return inner_.stats(); }
  bool fail_background = false;

 private:
  Device& inner_;
};

uint64_t ZipfRow(const ZipfSampler& zipf, Rng& rng) { return Mix64(zipf(rng)) >> 24; }

// One table of 256 B rows on a 64-page pool, a cpu device on the simulated clock.
struct Rig {
  explicit Rig(RefillOptions options, uint32_t budget_pages = 4) {
    pool = *HbmPool::Create(
        {.pool_bytes = kRefillPages * kRefillPageBytes, .page_bytes = kRefillPageBytes});
    cpu = *CpuDevice::Create({.pool_bytes = kRefillPages * kRefillPageBytes, .link = kLink}, clock);
    device = std::make_unique<FlakyDevice>(*cpu);
    cache =
        *EmbCache::Create({.tables = {{0, kRowBytes}}, .budget_pages = budget_pages}, *pool, clock);
    sketch = *PopularitySketch::Create({.capacity = 20000});
    auto r = Refiller::Create(options, *cache, *device, source, *sketch, clock);
    EXPECT_TRUE(r.ok()) << r.status();
    refiller = std::move(r).value();
    link = *EmulatedLink::Create(kLink, clock);  // for TransferTime only
  }
  ~Rig() {
    refiller.reset();
    while (clock.RunNext()) {
    }
  }
  // Looks up `n` Zipf rows one at a time, recording them; inserts misses when `admit`.
  double Lookups(int n, Rng& rng, bool admit) {
    ZipfSampler zipf(100000, 1.0);
    uint64_t hits = 0;
    EmbLookupResult r;
    for (int i = 0; i < n; ++i) {
      uint64_t row[1] = {ZipfRow(zipf, rng)};
      EXPECT_TRUE(cache->Lookup(0, row, &r).ok());
      sketch->RecordBatch(0, row);
      hits += r.hits;
      if (r.hits == 1 && source.fetched.contains(row[0])) CheckBytes(row[0], r.offsets[0]);
      if (r.hits == 0 && admit) {
        EXPECT_TRUE(cache->Insert(0, row[0]).ok());
      }
    }
    return static_cast<double>(hits) / n;
  }
  void CheckBytes(uint64_t row, uint64_t offset) {
    std::byte got[kRowBytes];
    ASSERT_TRUE(device->ReadPool(offset, got, kRowBytes).ok());
    for (uint32_t i = 0; i < kRowBytes; ++i) ASSERT_EQ(got[i], Pattern(0, row, i)) << row;
  }
  void RunUntilDone(absl::Duration limit) {
    const absl::Time end = clock.Now() + limit;
    while (!refiller->GetStats().done && clock.Now() < end) clock.AdvanceBy(absl::Microseconds(50));
  }

  SimClock clock;
  std::unique_ptr<HbmPool> pool;
  std::unique_ptr<CpuDevice> cpu;
  std::unique_ptr<FlakyDevice> device;
  std::unique_ptr<EmbCache> cache;
  std::unique_ptr<PopularitySketch> sketch;
  FakeRowSource source;
  std::unique_ptr<Refiller> refiller;
  std::unique_ptr<EmulatedLink> link;
};

RefillOptions Fast() {
  return {.chunk_bytes = 64 << 10,
          .max_copy_bytes = 64 << 10,
          .bytes_per_second = 1e12,
          .burst_bytes = 128 << 10,
          .poll_interval = absl::Microseconds(20)};
}

TEST(RefillerTest, RejectsBadOptions) {
  Rig rig(Fast());
  auto bad = [&](RefillOptions o) {
    auto r = Refiller::Create(o, *rig.cache, *rig.device, rig.source, *rig.sketch, rig.clock);
    return !r.ok() && r.status().code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(bad({.chunk_bytes = 0}));
  EXPECT_TRUE(bad({.max_copy_bytes = 0}));
  EXPECT_TRUE(bad({.bytes_per_second = 0}));
  EXPECT_TRUE(bad({.chunk_bytes = 1 << 20, .burst_bytes = 1 << 19}));
  EXPECT_TRUE(bad({.poll_interval = absl::ZeroDuration()}));
}

TEST(RefillerTest, FillsTheNewCapacityWithPopularRows) {
  Rig rig(Fast());
  Rng rng(1);
  rig.Lookups(200000, rng, /*admit=*/true);
  const double before = rig.Lookups(50000, rng, /*admit=*/false);
  rig.cache->SetBudgetPages(40);  // the EMB side won 36 pages
  const uint64_t free_slots = rig.cache->FreeSlots(0);
  const uint64_t evictions = rig.cache->GetStats().evictions;
  rig.refiller->Kick();
  rig.RunUntilDone(absl::Seconds(1));
  RefillStats s = rig.refiller->GetStats();
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.rows_refilled, free_slots);  // every free slot, never an eviction
  EXPECT_EQ(s.bytes_refilled, free_slots * kRowBytes);
  EXPECT_EQ(rig.cache->GetStats().evictions, evictions);
  EXPECT_EQ(rig.cache->GetStats().pending_entries, 0u);
  EXPECT_EQ(rig.cache->FreeSlots(0), 0u);
  EXPECT_GE(s.chunks, free_slots * kRowBytes / (64 << 10));
  EXPECT_EQ(rig.device->stats().bytes[static_cast<int>(CopyPurpose::kEmbRefill)], s.bytes_refilled);
  const double after = rig.Lookups(50000, rng, /*admit=*/false);  // also checks refilled bytes
  std::cout << "hit rate before refill " << before << ", after " << after << " (" << s.chunks
            << " chunks, " << s.rows_refilled << " rows)\n";
  EXPECT_GE(after, before + 0.15);
  EXPECT_TRUE(rig.cache->CheckInvariants().ok()) << rig.cache->CheckInvariants();
}

TEST(RefillerTest, NeverDelaysACriticalCopyByMoreThanOneChunk) {
  Rig rig(Fast(), /*budget_pages=*/0);
  Rng rng(2);
  rig.Lookups(100000, rng, /*admit=*/false);
  const PageId kv_page = *rig.pool->AllocPage(PageOwner::kKv);
  rig.cache->SetBudgetPages(48);
  rig.refiller->Kick();
  constexpr size_t kCriticalBytes = 4096;
  std::vector<std::byte> src(kCriticalBytes);
  const absl::Duration own = rig.link->TransferTime(kCriticalBytes);
  const absl::Duration bound = rig.link->TransferTime(64 << 10);
  absl::Duration worst = absl::ZeroDuration();
  int criticals = 0;
  while (!rig.refiller->GetStats().done) {
    rig.clock.AdvanceBy(absl::Microseconds(rng() % 300));
    const absl::Time submitted = rig.clock.Now();
    absl::Time completed = absl::InfiniteFuture();
    rig.device->CopyToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, src.data(),
                           rig.pool->PageOffset(kv_page), kCriticalBytes, [&](absl::Status st) {
                             EXPECT_TRUE(st.ok());
                             completed = rig.clock.Now();
                           });
    while (completed == absl::InfiniteFuture()) ASSERT_TRUE(rig.clock.RunNext());
    const absl::Duration delay = completed - submitted - own;
    ASSERT_LE(delay, bound) << "critical copy " << criticals;
    worst = std::max(worst, delay);
    ++criticals;
  }
  RefillStats s = rig.refiller->GetStats();
  std::cout << criticals << " critical copies during refill of " << s.bytes_refilled
            << " bytes: worst delay " << worst << " (bound " << bound << "), refill deferred "
            << s.deferred_critical << " times\n";
  EXPECT_GT(worst, absl::ZeroDuration());  // the copies did overlap refill
  EXPECT_GT(s.deferred_critical, 0u);
  EXPECT_GT(criticals, 20);
  EXPECT_EQ(s.rows_refilled, 48u * 256);
}

TEST(RefillerTest, RespectsTheRateLimit) {
  RefillOptions o = Fast();
  o.bytes_per_second = 20e6;
  o.burst_bytes = 64 << 10;
  Rig rig(o, 0);
  Rng rng(3);
  rig.Lookups(100000, rng, /*admit=*/false);
  rig.cache->SetBudgetPages(48);  // 3 MiB: 150 ms at 20 MB/s
  const absl::Time t0 = rig.clock.Now();
  rig.refiller->Kick();
  for (int ms = 1; ms <= 100; ++ms) {
    rig.clock.AdvanceTo(t0 + absl::Milliseconds(ms));
    const double allowed = 20e6 * ms / 1000.0 + (64 << 10);
    ASSERT_LE(rig.refiller->GetStats().bytes_refilled, allowed) << ms << " ms";
  }
  RefillStats s = rig.refiller->GetStats();
  std::cout << "refilled " << s.bytes_refilled << " bytes in 100 ms at 20 MB/s, deferred "
            << s.deferred_rate << " times for tokens\n";
  EXPECT_GE(s.bytes_refilled, 0.8 * 20e6 * 0.1);
  EXPECT_GT(s.deferred_rate, 0u);
  EXPECT_FALSE(s.done);
}

TEST(RefillerTest, CancelStopsIssuingChunks) {
  RefillOptions o = Fast();
  o.bytes_per_second = 50e6;
  Rig rig(o, 0);
  Rng rng(4);
  rig.Lookups(100000, rng, /*admit=*/false);
  rig.cache->SetBudgetPages(48);
  rig.refiller->Kick();
  rig.clock.AdvanceBy(absl::Milliseconds(10));
  const uint64_t at_cancel = rig.refiller->GetStats().rows_refilled;
  EXPECT_GT(at_cancel, 0u);
  rig.refiller->Cancel();
  rig.clock.AdvanceBy(absl::Milliseconds(200));
  RefillStats s = rig.refiller->GetStats();
  EXPECT_TRUE(s.cancelled);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.backlog_rows, 0u);
  EXPECT_LE(s.rows_refilled, at_cancel + (64 << 10) / kRowBytes);  // at most the chunk in flight
  EXPECT_EQ(rig.cache->GetStats().pending_entries, 0u);
  // A new Kick resumes.
  rig.refiller->Kick();
  rig.RunUntilDone(absl::Seconds(1));
  EXPECT_EQ(rig.refiller->GetStats().rows_refilled, 48u * 256);
  EXPECT_FALSE(rig.refiller->GetStats().cancelled);
}

// The node kicks from a timer of its own clock; the plan (the whole sketch, a cache lookup per
// row) must not run there but in a timer of the Refiller's clock.
TEST(RefillerTest, KickPlansInATimerOfTheRefillersClock) {
  Rig rig(Fast(), 0);
  Rng rng(7);
  rig.Lookups(50000, rng, /*admit=*/false);
  rig.cache->SetBudgetPages(8);
  rig.refiller->Kick();
  RefillStats s = rig.refiller->GetStats();
  EXPECT_EQ(s.kicks, 1u);
  EXPECT_FALSE(s.done);              // a plan is pending ...
  EXPECT_EQ(s.backlog_rows, 0u);     // ... and not made on the caller's thread
  ASSERT_TRUE(rig.clock.RunNext());  // the plan's timer: planned, nothing issued yet
  s = rig.refiller->GetStats();
  EXPECT_GT(s.backlog_rows, 0u);
  EXPECT_EQ(s.rows_refilled, 0u);
  rig.RunUntilDone(absl::Seconds(1));
  EXPECT_EQ(rig.refiller->GetStats().rows_refilled, 8u * 256);

  // A Cancel before the plan is made voids the Kick; of two Kicks in a row only the last plans.
  rig.cache->SetBudgetPages(16);
  rig.refiller->Kick();
  rig.refiller->Cancel();
  rig.clock.AdvanceBy(absl::Milliseconds(100));  // runs the voided plan's timer
  s = rig.refiller->GetStats();
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(s.cancelled);
  EXPECT_EQ(s.rows_refilled, 8u * 256);
  rig.refiller->Kick();
  rig.refiller->Kick();
  ASSERT_TRUE(rig.clock.RunNext());  // the first Kick's timer: voided
  EXPECT_EQ(rig.refiller->GetStats().backlog_rows, 0u);
  EXPECT_FALSE(rig.refiller->GetStats().done);
  rig.RunUntilDone(absl::Seconds(1));
  EXPECT_EQ(rig.refiller->GetStats().rows_refilled, 16u * 256);
  EXPECT_EQ(rig.refiller->GetStats().kicks, 4u);
}

TEST(RefillerTest, FailuresLeaveNoPendingEntries) {
  Rig rig(Fast(), 0);
  Rng rng(5);
  rig.Lookups(50000, rng, /*admit=*/false);
  rig.cache->SetBudgetPages(8);
  // The row source is down: nothing is reserved.
  rig.source.fail = true;
  rig.refiller->Kick();
  rig.RunUntilDone(absl::Seconds(1));
  RefillStats s = rig.refiller->GetStats();
  EXPECT_GT(s.chunks_failed, 0u);
  EXPECT_EQ(s.rows_refilled, 0u);
  EXPECT_EQ(rig.cache->GetStats().entries, 0u);
  EXPECT_EQ(rig.cache->GetStats().pending_entries, 0u);
  // The copies fail: every reservation of the chunk is aborted and its slot freed.
  rig.source.fail = false;
  rig.device->fail_background = true;
  const uint64_t free_slots = rig.cache->FreeSlots(0);
  rig.refiller->Kick();
  rig.RunUntilDone(absl::Seconds(1));
  s = rig.refiller->GetStats();
  EXPECT_GT(s.rows_aborted, 0u);
  EXPECT_EQ(s.rows_refilled, 0u);
  EXPECT_EQ(rig.cache->GetStats().pending_entries, 0u);
  EXPECT_EQ(rig.cache->GetStats().entries, 0u);
  EXPECT_EQ(rig.cache->FreeSlots(0), free_slots);
  EXPECT_TRUE(rig.cache->CheckInvariants().ok()) << rig.cache->CheckInvariants();
  // Healthy again: a Kick fills the capacity.
  rig.device->fail_background = false;
  rig.refiller->Kick();
  rig.RunUntilDone(absl::Seconds(1));
  EXPECT_EQ(rig.refiller->GetStats().rows_refilled, 8u * 256);
}

}  // namespace
}  // namespace hlem::serving
