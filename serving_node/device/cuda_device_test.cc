// The `cuda` device through the serving::Device interface, against the `cpu` device as reference.
// Skipped where no GPU is visible (CI); run on a GPU host that has the full toolchain. On a bare
// GPU host scripts/gpu-check.sh runs the same comparisons through hlem_cuda_check.

#include "serving_node/device/cuda_device.h"

#include <cstring>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/popularity.h"
#include "serving_node/core/refill.h"
#include "serving_node/core/row_source.h"
#include "serving_node/device/cpu_device.h"

namespace hlem::serving {
namespace {

bool HaveGpu() { return cuda::CudaDeviceCount() > 0; }

TEST(CudaDeviceTest, CreateSaysWhyWithoutADevice) {
  if (HaveGpu()) GTEST_SKIP() << "a GPU is present";
  auto device = CudaDevice::Create({.pool_bytes = 1 << 20});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(device.status().message().find("no CUDA device"), std::string::npos) << device.status();
  EXPECT_EQ(CudaDevice::Create({.pool_bytes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Staging pieces must be 16-byte multiples (row batches align their offsets and rows in them).
  EXPECT_EQ(CudaDevice::Create({.pool_bytes = 1 << 20, .max_piece_bytes = 1000}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class CudaDeviceGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    auto d = CudaDevice::Create({.pool_bytes = 64 << 20});
    ASSERT_TRUE(d.ok()) << d.status();
    gpu_ = std::move(d).value();
    cpu_ = *CpuDevice::Create({.pool_bytes = 64 << 20}, clock_);
    // The same bytes in both pools.
    std::vector<std::byte> bytes(64 << 20);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(Mix64(i));
    WriteBothPools(0, bytes.data(), bytes.size());
  }
  // The same bytes at `offset` of both pools.
  void WriteBothPools(uint64_t offset, const void* src, size_t bytes) {
    std::memcpy(cpu_->pool_data() + offset, src, bytes);
    absl::Notification done;
    absl::Status status;
    gpu_->CopyToPool(CopyClass::kBackground, CopyPurpose::kOther,
                     static_cast<const std::byte*>(src), offset, bytes, [&](absl::Status s) {
                       status = s;
                       done.Notify();
                     });
    done.WaitForNotification();
    ASSERT_TRUE(status.ok()) << status;
  }
  SimClock clock_;
  std::unique_ptr<CudaDevice> gpu_;
  std::unique_ptr<CpuDevice> cpu_;
};

TEST_F(CudaDeviceGpuTest, GatherMatchesTheCpuDevice) {
  Rng rng(1);
  for (uint32_t row_bytes : {7u, 256u, 2048u}) {
    std::vector<uint64_t> offsets(5000);
    for (auto& o : offsets) o = rng() % ((64 << 20) - row_bytes);
    auto a = *gpu_->AllocBuffer(offsets.size() * row_bytes);
    auto b = *cpu_->AllocBuffer(offsets.size() * row_bytes);
    ASSERT_TRUE(gpu_->GatherRows(offsets, row_bytes, *a).ok());
    ASSERT_TRUE(cpu_->GatherRows(offsets, row_bytes, *b).ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    std::vector<std::byte> got(a->size()), want(b->size());
    ASSERT_TRUE(gpu_->ReadBuffer(*a, 0, got.data(), got.size()).ok());
    ASSERT_TRUE(cpu_->ReadBuffer(*b, 0, want.data(), want.size()).ok());
    EXPECT_EQ(got, want) << row_bytes;
  }
}

TEST_F(CudaDeviceGpuTest, SumRowsMatchesTheCpuDeviceBitForBit) {
  // Finite floats (random bytes hold NaNs, whose payloads the two devices propagate differently).
  constexpr uint32_t kDim = 512, kPoolRows = 4096, kExtraRows = 64, kFeatures = 3;
  constexpr uint64_t kRowBytes = kDim * sizeof(float);
  Rng rng(3);
  auto values = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = (static_cast<float>(rng() % 20001) - 10000.0f) / 4096.0f;
    return v;
  };
  const std::vector<float> pool_rows = values(size_t{kPoolRows} * kDim);
  const std::vector<float> extra_rows = values(size_t{kExtraRows} * kDim);
  WriteBothPools(0, pool_rows.data(), pool_rows.size() * sizeof(float));
  auto gpu_extra = *gpu_->AllocBuffer(extra_rows.size() * sizeof(float));
  auto cpu_extra = *cpu_->AllocBuffer(extra_rows.size() * sizeof(float));
  const auto* extra_bytes = reinterpret_cast<const std::byte*>(extra_rows.data());
  ASSERT_TRUE(gpu_->WriteBuffer(*gpu_extra, 0, extra_bytes, gpu_extra->size()).ok());
  ASSERT_TRUE(cpu_->WriteBuffer(*cpu_extra, 0, extra_bytes, cpu_extra->size()).ok());
  for (uint32_t tokens : {1u, 1000u, 20000u}) {
    std::vector<uint64_t> sources(size_t{tokens} * kFeatures);
    for (size_t i = 0; i < sources.size(); ++i) {
      sources[i] =
          i % 7 == 3 ? RowInBuffer(rng() % kExtraRows * kRowBytes) : rng() % kPoolRows * kRowBytes;
    }
    auto a = *gpu_->AllocBuffer(tokens * kRowBytes);
    auto b = *cpu_->AllocBuffer(tokens * kRowBytes);
    ASSERT_TRUE(gpu_->SumRows(sources, kFeatures, kDim, gpu_extra.get(), *a).ok());
    ASSERT_TRUE(cpu_->SumRows(sources, kFeatures, kDim, cpu_extra.get(), *b).ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    std::vector<std::byte> got(a->size()), want(b->size());
    ASSERT_TRUE(gpu_->ReadBuffer(*a, 0, got.data(), got.size()).ok());
    ASSERT_TRUE(cpu_->ReadBuffer(*b, 0, want.data(), want.size()).ok());
    EXPECT_EQ(got, want) << tokens << " tokens";
  }
  // A buffer the cuda device did not allocate, and a buffer row with no buffer, are refused.
  auto out = *gpu_->AllocBuffer(kRowBytes);
  const std::vector<uint64_t> one = {0};
  EXPECT_EQ(gpu_->SumRows(one, 1, kDim, nullptr, *cpu_extra).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<uint64_t> in_buffer = {RowInBuffer(0)};
  EXPECT_EQ(gpu_->SumRows(in_buffer, 1, kDim, nullptr, *out).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceGpuTest, ScatterMatchesTheCpuDevice) {
  KvGeometry g{.layers = 2, .kv_dim = 128, .dtype_bytes = 2, .page_bytes = 64 << 10};
  g.page_tokens = static_cast<uint32_t>(g.page_bytes / g.token_bytes());
  std::vector<uint64_t> pages;
  std::vector<uint32_t> slots;
  for (uint32_t t = 0; t < 1000; ++t) {
    pages.push_back(uint64_t{t % 100} * g.page_bytes);
    slots.push_back(t / 100);
  }
  std::vector<std::byte> batch(pages.size() * g.token_bytes());
  for (size_t i = 0; i < batch.size(); ++i) batch[i] = static_cast<std::byte>(Mix64(i + 5));
  auto a = *gpu_->AllocBuffer(batch.size());
  auto b = *cpu_->AllocBuffer(batch.size());
  ASSERT_TRUE(gpu_->WriteBuffer(*a, 0, batch.data(), batch.size()).ok());
  ASSERT_TRUE(cpu_->WriteBuffer(*b, 0, batch.data(), batch.size()).ok());
  ASSERT_TRUE(gpu_->ScatterKv(g, pages, slots, *a).ok());
  ASSERT_TRUE(cpu_->ScatterKv(g, pages, slots, *b).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  std::vector<std::byte> got(100 * g.page_bytes), want(100 * g.page_bytes);
  ASSERT_TRUE(gpu_->ReadPool(0, got.data(), got.size()).ok());
  ASSERT_TRUE(cpu_->ReadPool(0, want.data(), want.size()).ok());
  EXPECT_EQ(got, want);
}

TEST_F(CudaDeviceGpuTest, RowCopiesMatchTheCpuDevice) {
  Rng rng(9);
  for (uint32_t row_bytes : {7u, 256u, 2048u}) {
    // Distinct slots, some runs of consecutive ones: every 3rd slot follows the one before.
    std::vector<uint64_t> slots;
    const uint64_t count = (64 << 20) / row_bytes;
    absl::flat_hash_set<uint64_t> used;
    while (slots.size() < 3000) {
      uint64_t slot = rng() % count;
      if (slots.size() % 3 == 2 && slots.back() / row_bytes + 1 < count &&
          !used.contains(slots.back() / row_bytes + 1)) {
        slot = slots.back() / row_bytes + 1;
      }
      if (!used.insert(slot).second) continue;
      slots.push_back(slot * row_bytes);
    }
    std::vector<std::byte> src(slots.size() * row_bytes);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(Mix64(i + row_bytes));
    absl::Notification gpu_done;
    absl::Status gpu_status, cpu_status;
    gpu_->CopyRowsToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, src.data(), slots, row_bytes,
                         1 << 20, [&](absl::Status s) {
                           gpu_status = s;
                           gpu_done.Notify();
                         });
    cpu_->CopyRowsToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, src.data(), slots, row_bytes,
                         1 << 20, [&](absl::Status s) { cpu_status = s; });
    clock_.AdvanceBy(absl::Seconds(1));
    ASSERT_TRUE(gpu_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    ASSERT_TRUE(gpu_status.ok()) << gpu_status;
    ASSERT_TRUE(cpu_status.ok()) << cpu_status;
  }
  std::vector<std::byte> got(64 << 20), want(64 << 20);
  ASSERT_TRUE(gpu_->ReadPool(0, got.data(), got.size()).ok());
  ASSERT_TRUE(cpu_->ReadPool(0, want.data(), want.size()).ok());
  EXPECT_TRUE(got == want);
  // One copy for each call on the GPU, whatever the runs.
  EXPECT_EQ(gpu_->stats().copies[static_cast<int>(CopyPurpose::kEmbMiss)], 3u);
  absl::Status bad;
  const uint64_t leaves[] = {(64 << 20) - 100};
  std::byte row[256] = {};
  gpu_->CopyRowsToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, row, leaves, 256, 1 << 20,
                       [&](absl::Status s) { bad = s; });
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceGpuTest, BadArgumentsAreRejectedAsOnTheCpuDevice) {
  auto buf = *gpu_->AllocBuffer(1024);
  const uint64_t out_of_pool[] = {(64 << 20) - 10};
  EXPECT_EQ(gpu_->GatherRows(out_of_pool, 256, *buf).code(), absl::StatusCode::kInvalidArgument);
  std::byte x[8];
  EXPECT_EQ(gpu_->ReadBuffer(*buf, 1020, x, 8).code(), absl::StatusCode::kInvalidArgument);
  auto host = *cpu_->AllocBuffer(1024);  // another device's buffer: a host address
  const uint64_t zero[] = {0};
  EXPECT_EQ(gpu_->GatherRows(zero, 256, *host).code(), absl::StatusCode::kInvalidArgument);
  absl::Status copy;
  gpu_->CopyToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, x, (64 << 20) - 4, 8,
                   [&](absl::Status s) { copy = s; });
  EXPECT_EQ(copy.code(), absl::StatusCode::kInvalidArgument);
}

// Serves row r of table t as bytes KeyedHash(t, r, i / 8); remembers what it served.
class PatternRowSource final : public RowSource {
 public:
  static std::byte Byte(uint32_t table, uint64_t row, size_t i) {
    return static_cast<std::byte>(KeyedHash(table, row, i / 8) >> (8 * (i % 8)));
  }
  absl::Status Fetch(uint32_t table_id, std::span<const uint64_t> rows, std::span<std::byte> out,
                     absl::Time /*deadline*/) override {
    const size_t row_bytes = out.size() / rows.size();
    for (size_t r = 0; r < rows.size(); ++r) {
      for (size_t i = 0; i < row_bytes; ++i) out[r * row_bytes + i] = Byte(table_id, rows[r], i);
    }
    absl::MutexLock lock(&mu_);
    fetched_.insert(rows.begin(), rows.end());
    return absl::OkStatus();
  }
  std::vector<uint64_t> fetched() const {
    absl::MutexLock lock(&mu_);
    return {fetched_.begin(), fetched_.end()};
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_set<uint64_t> fetched_ ABSL_GUARDED_BY(mu_);
};

// The memory system's refill on a real GPU, on the real clock: after the EMB side wins pages,
// the Refiller fetches the most popular rows and copies them in chunks through the pinned
// staging into the cudaMalloc'd pool. Every refilled row must then be a hit whose slot holds
// that row's bytes, read back both by ReadPool and by the gather kernel.
TEST(CudaDeviceRefillTest, RefilledRowsHoldTheirOwnBytesInTheGpuPool) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kRowBytes = 256;
  constexpr uint64_t kPageBytes = 64 << 10;
  constexpr uint32_t kPages = 64;
  auto device = *CudaDevice::Create({.pool_bytes = kPages * kPageBytes});
  Clock& clock = RealClock::Get();
  auto pool = *HbmPool::Create({.pool_bytes = kPages * kPageBytes, .page_bytes = kPageBytes});
  auto cache = *EmbCache::Create({.tables = {{0, kRowBytes}}, .budget_pages = 4}, *pool, clock);
  auto sketch = *PopularitySketch::Create({.capacity = 20000});
  PatternRowSource source;
  Rng rng(3);
  for (int i = 0; i < 200000; ++i) {  // a skewed popularity over 100 000 rows
    const uint64_t row[1] = {rng() % (1 + rng() % 100000)};
    sketch->RecordBatch(0, row);
  }
  auto refiller = Refiller::Create({.chunk_bytes = 64 << 10,
                                    .max_copy_bytes = 64 << 10,
                                    .bytes_per_second = 1e10,
                                    .burst_bytes = 128 << 10,
                                    .poll_interval = absl::Microseconds(100)},
                                   *cache, *device, source, *sketch, clock);
  ASSERT_TRUE(refiller.ok()) << refiller.status();
  cache->SetBudgetPages(40);  // the EMB side won 36 pages
  const uint64_t free_slots = cache->FreeSlots(0);
  ASSERT_GT(free_slots, 9000u);
  (*refiller)->Kick();
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (!(*refiller)->GetStats().done && absl::Now() < end) absl::SleepFor(absl::Milliseconds(1));
  const RefillStats stats = (*refiller)->GetStats();
  ASSERT_TRUE(stats.done) << "refill not done in 20 s: " << stats.rows_refilled << " rows";
  EXPECT_EQ(stats.rows_refilled, free_slots);
  EXPECT_EQ(cache->GetStats().pending_entries, 0u);
  EXPECT_EQ(device->stats().bytes[static_cast<int>(CopyPurpose::kEmbRefill)], stats.bytes_refilled);

  const std::vector<uint64_t> rows = source.fetched();
  ASSERT_EQ(rows.size(), free_slots);
  EmbLookupResult hit;
  ASSERT_TRUE(cache->Lookup(0, rows, &hit).ok());
  ASSERT_EQ(hit.hits, rows.size());
  auto gathered = *device->AllocBuffer(rows.size() * kRowBytes);
  ASSERT_TRUE(device->GatherRows(hit.offsets, kRowBytes, *gathered).ok());
  ASSERT_TRUE(device->Synchronize().ok());
  std::vector<std::byte> batch(rows.size() * kRowBytes), one(kRowBytes);
  ASSERT_TRUE(device->ReadBuffer(*gathered, 0, batch.data(), batch.size()).ok());
  size_t wrong = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    ASSERT_TRUE(device->ReadPool(hit.offsets[r], one.data(), kRowBytes).ok());
    for (size_t i = 0; i < kRowBytes; ++i) {
      const std::byte want = PatternRowSource::Byte(0, rows[r], i);
      wrong += (one[i] != want) + (batch[r * kRowBytes + i] != want);
    }
  }
  EXPECT_EQ(wrong, 0u) << "bytes differing from their rows' content";
  EXPECT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

}  // namespace
}  // namespace hlem::serving
