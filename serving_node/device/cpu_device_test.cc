#include "serving_node/device/cpu_device.h"

#include <string>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"

namespace hlem::serving {
namespace {

TEST(CpuDeviceTest, CopiesLandWhenTheTransferCompletesAndAreCountedByPurpose) {
  SimClock clock;
  auto device = *CpuDevice::Create(
      {.pool_bytes = 1 << 16, .link = {.bytes_per_second = 1e9, .latency = absl::Microseconds(1)}},
      clock);
  std::vector<std::byte> src(256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(i);
  absl::Status result = absl::UnknownError("not called");
  device->CopyToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, src.data(), 4096, src.size(),
                     [&](absl::Status s) { result = s; });
  std::vector<std::byte> back(256);
  ASSERT_TRUE(device->ReadPool(4096, back.data(), back.size()).ok());
  EXPECT_NE(back, src);  // not there yet: the link has not moved it
  clock.AdvanceBy(absl::Microseconds(2));
  EXPECT_TRUE(result.ok());
  ASSERT_TRUE(device->ReadPool(4096, back.data(), back.size()).ok());
  EXPECT_EQ(back, src);
  DeviceCopyStats stats = device->stats();
  EXPECT_EQ(stats.copies[static_cast<int>(CopyPurpose::kEmbMiss)], 1u);
  EXPECT_EQ(stats.bytes[static_cast<int>(CopyPurpose::kEmbMiss)], 256u);
  EXPECT_EQ(stats.bytes[static_cast<int>(CopyPurpose::kKv)], 0u);
  EXPECT_GT(stats.link_busy_ns, 0u);
}

TEST(CpuDeviceTest, OutOfPoolCopiesAreRejected) {
  SimClock clock;
  auto device = *CpuDevice::Create({.pool_bytes = 4096}, clock);
  std::vector<std::byte> src(16);
  absl::Status result;
  device->CopyToPool(CopyClass::kCritical, CopyPurpose::kOther, src.data(), 4090, 16,
                     [&](absl::Status s) { result = s; });
  EXPECT_EQ(result.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(device->ReadPool(1ull << 40, src.data(), 16).ok());
  EXPECT_FALSE(CpuDevice::Create({.pool_bytes = 0}, clock).ok());
}

// A request's misses: one copy per run of consecutive slots (at most max_copy_bytes), one done
// after the last; a bad row rejects the whole call before anything moves.
TEST(CpuDeviceTest, RowCopiesGoAsOneCopyPerRunOfConsecutiveSlots) {
  SimClock clock;
  auto device = *CpuDevice::Create(
      {.pool_bytes = 1 << 16, .link = {.bytes_per_second = 1e9, .latency = absl::Microseconds(1)}},
      clock);
  constexpr uint32_t kRow = 16;
  // Runs: {0,16,32} {256} {512,528 | 544,560} (max_copy_bytes 32 cuts the last), {4000}.
  const std::vector<uint64_t> slots = {0, 16, 32, 256, 512, 528, 544, 560, 4000};
  std::vector<std::byte> src(slots.size() * kRow);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(i * 7 + 1);
  int calls = 0;
  absl::Status result = absl::UnknownError("not called");
  auto done = [&](absl::Status s) {
    ++calls;
    result = s;
  };
  device->CopyRowsToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, src.data(), slots, kRow, 48,
                         done);
  EXPECT_EQ(calls, 0);
  clock.AdvanceBy(absl::Microseconds(100));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(result.ok()) << result;
  for (size_t i = 0; i < slots.size(); ++i) {
    std::vector<std::byte> back(kRow);
    ASSERT_TRUE(device->ReadPool(slots[i], back.data(), kRow).ok());
    EXPECT_EQ(back, std::vector<std::byte>(src.begin() + i * kRow, src.begin() + (i + 1) * kRow))
        << "row " << i;
  }
  DeviceCopyStats stats = device->stats();
  EXPECT_EQ(stats.copies[static_cast<int>(CopyPurpose::kEmbMiss)], 5u);
  EXPECT_EQ(stats.bytes[static_cast<int>(CopyPurpose::kEmbMiss)], src.size());

  const std::vector<uint64_t> bad = {64, (1 << 16) - 8};
  device->CopyRowsToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, src.data(), bad, kRow, 48,
                         done);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(result.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.message().find("row 1"), std::string::npos) << result;
  device->CopyRowsToPool(CopyClass::kCritical, CopyPurpose::kEmbMiss, src.data(), {}, kRow, 48,
                         done);
  EXPECT_EQ(calls, 3);  // no rows: done at once
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(device->stats().copies[static_cast<int>(CopyPurpose::kEmbMiss)], 5u);
}

TEST(CpuDeviceTest, BufferCopiesCrossTheLinkToo) {
  SimClock clock;
  auto device = *CpuDevice::Create(
      {.pool_bytes = 4096, .link = {.bytes_per_second = 1e9, .latency = absl::Microseconds(1)}},
      clock);
  auto buffer = *device->AllocBuffer(64);
  std::vector<std::byte> src(32, std::byte{7});
  absl::Status result = absl::UnknownError("not called");
  device->CopyToBuffer(CopyClass::kCritical, CopyPurpose::kEmbMiss, src.data(), *buffer, 16, 32,
                       [&](absl::Status s) { result = s; });
  EXPECT_EQ(result.code(), absl::StatusCode::kUnknown);  // on the link, not yet landed
  clock.AdvanceBy(absl::Microseconds(2));
  EXPECT_TRUE(result.ok()) << result;
  std::vector<std::byte> back(32);
  ASSERT_TRUE(device->ReadBuffer(*buffer, 16, back.data(), back.size()).ok());
  EXPECT_EQ(back, src);
  EXPECT_EQ(device->stats().bytes[static_cast<int>(CopyPurpose::kEmbMiss)], 32u);
  device->CopyToBuffer(CopyClass::kCritical, CopyPurpose::kEmbMiss, src.data(), *buffer, 48, 32,
                       [&](absl::Status s) { result = s; });
  EXPECT_EQ(result.code(), absl::StatusCode::kInvalidArgument) << result;
}

std::byte PoolByte(uint64_t i) { return static_cast<std::byte>(Mix64(i) & 0xff); }

std::unique_ptr<CpuDevice> PatternDevice(SimClock& clock, uint64_t bytes) {
  auto device = *CpuDevice::Create({.pool_bytes = bytes}, clock);
  for (uint64_t i = 0; i < bytes; ++i) device->pool_data()[i] = PoolByte(i);
  return device;
}

TEST(CpuDeviceTest, GatherRowsCopiesEachRowFromItsSlot) {
  SimClock clock;
  auto device = PatternDevice(clock, 1 << 20);
  for (uint32_t row_bytes : {1u, 13u, 256u, 2048u}) {
    Rng rng(row_bytes);
    std::vector<uint64_t> offsets(300);
    for (auto& o : offsets) o = rng() % ((1 << 20) - row_bytes + 1);  // unaligned too
    auto dst = *device->AllocBuffer(offsets.size() * row_bytes);
    ASSERT_TRUE(device->GatherRows(offsets, row_bytes, *dst).ok());
    ASSERT_TRUE(device->Synchronize().ok());
    std::vector<std::byte> host(dst->size());
    ASSERT_TRUE(device->ReadBuffer(*dst, 0, host.data(), host.size()).ok());
    for (size_t i = 0; i < offsets.size(); ++i) {
      for (uint32_t b = 0; b < row_bytes; ++b) {
        ASSERT_EQ(host[i * row_bytes + b], PoolByte(offsets[i] + b)) << row_bytes << " row " << i;
      }
    }
  }
}

// Each token's input is its feature rows added in feature order, read from the pool or from the
// extra buffer, and nothing past the sums is written.
TEST(CpuDeviceTest, SumRowsAddsEachTokensRowsWhereTheyLie) {
  SimClock clock;
  constexpr uint32_t kDim = 6, kFeatures = 2, kTokens = 50;
  constexpr uint64_t kRowBytes = kDim * sizeof(float);
  auto device = *CpuDevice::Create({.pool_bytes = 1 << 16}, clock);
  float* pool = reinterpret_cast<float*>(device->pool_data());
  for (size_t i = 0; i < (1 << 16) / sizeof(float); ++i) pool[i] = static_cast<float>(i % 97);
  std::vector<float> extra_rows(10 * kDim);
  for (size_t i = 0; i < extra_rows.size(); ++i) extra_rows[i] = -0.5f * static_cast<float>(i);
  auto extra = *device->AllocBuffer(extra_rows.size() * sizeof(float));
  ASSERT_TRUE(device
                  ->WriteBuffer(*extra, 0, reinterpret_cast<const std::byte*>(extra_rows.data()),
                                extra->size())
                  .ok());
  Rng rng(5);
  std::vector<uint64_t> sources(kTokens * kFeatures);
  for (size_t i = 0; i < sources.size(); ++i) {
    sources[i] = i % 3 == 0 ? RowInBuffer(rng() % 10 * kRowBytes)
                            : rng() % ((1 << 16) / sizeof(float) - kDim) * sizeof(float);
  }
  auto dst = *device->AllocBuffer((kTokens + 1) * kRowBytes);  // one spare row, left alone
  std::vector<float> sums(kTokens * kDim + kDim, 42.0f);
  ASSERT_TRUE(
      device->WriteBuffer(*dst, 0, reinterpret_cast<const std::byte*>(sums.data()), dst->size())
          .ok());
  ASSERT_TRUE(device->SumRows(sources, kFeatures, kDim, extra.get(), *dst).ok());
  ASSERT_TRUE(device->Synchronize().ok());
  ASSERT_TRUE(
      device->ReadBuffer(*dst, 0, reinterpret_cast<std::byte*>(sums.data()), dst->size()).ok());
  for (uint32_t t = 0; t < kTokens; ++t) {
    for (uint32_t d = 0; d < kDim; ++d) {
      float want = 0.0f;
      for (uint32_t f = 0; f < kFeatures; ++f) {
        const uint64_t s = sources[t * kFeatures + f];
        want += (s & kRowInBuffer) != 0 ? extra_rows[(s & ~kRowInBuffer) / sizeof(float) + d]
                                        : pool[s / sizeof(float) + d];
      }
      ASSERT_EQ(sums[t * kDim + d], want) << "token " << t << " dim " << d;
    }
  }
  for (uint32_t d = 0; d < kDim; ++d) EXPECT_EQ(sums[kTokens * kDim + d], 42.0f);
}

TEST(CpuDeviceTest, SumRowsRejectsBadArgumentsNamingThem) {
  SimClock clock;
  auto device = *CpuDevice::Create({.pool_bytes = 1 << 16}, clock);
  auto dst = *device->AllocBuffer(64);
  auto extra = *device->AllocBuffer(64);
  auto refused = [&](std::vector<uint64_t> sources, uint32_t per_token, uint32_t dim,
                     const DeviceBuffer* with, const std::string& want) {
    const absl::Status st = device->SumRows(sources, per_token, dim, with, *dst);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_NE(st.message().find(want), std::string::npos) << st;
  };
  refused({0, 16, 32}, 2, 4, nullptr, "not whole tokens of 2");
  refused({}, 1, 4, nullptr, "0 sources");
  refused({0}, 0, 4, nullptr, "per_token and dim must be positive");
  refused({0}, 1, 0, nullptr, "per_token and dim must be positive");
  refused({(1 << 16) - 8}, 1, 4, nullptr, "leaves the 65536-byte pool");
  refused({2}, 1, 4, nullptr, "not 4-byte aligned");
  refused({RowInBuffer(0)}, 1, 4, nullptr, "leaves the 0-byte extra buffer");
  refused({RowInBuffer(56)}, 1, 4, extra.get(), "leaves the 64-byte extra buffer");
  refused({0, 0, 0, 0, 0}, 1, 4, nullptr, "5 sums of 16 bytes do not fit a buffer of 64");
  EXPECT_TRUE(
      device->SumRows(std::vector<uint64_t>{0, RowInBuffer(48)}, 2, 4, extra.get(), *dst).ok());
}

// New K/V placed by a real KvCache append: every token's vectors land where KvGeometry says the
// attention kernel reads them, and nothing else in the pool changes.
TEST(CpuDeviceTest, ScatterKvPutsEachTokensVectorsInItsPageSlot) {
  SimClock clock;
  constexpr uint64_t kPageBytes = 16 << 10;
  auto pool = *HbmPool::Create({.pool_bytes = 16 * kPageBytes, .page_bytes = kPageBytes});
  auto kv = *KvCache::Create({.layers = 3, .kv_dim = 8, .dtype_bytes = 4}, *pool, nullptr, clock);
  const KvGeometry& g = kv->layout();  // 3 · 2 · 32 B = 192 B a token: 85 tokens a page
  auto device = PatternDevice(clock, 16 * kPageBytes);
  std::vector<std::byte> before(device->pool_bytes());
  ASSERT_TRUE(device->ReadPool(0, before.data(), before.size()).ok());

  std::vector<uint64_t> history(200);
  for (size_t i = 0; i < history.size(); ++i) history[i] = 1000 + i;
  auto append = kv->Append(7, KvPrefix{}, history);
  ASSERT_TRUE(append.ok()) << append.status();
  ASSERT_GT(append->runs.size(), 2u);  // 200 tokens over three pages
  std::vector<uint64_t> page_offsets;
  std::vector<uint32_t> slots;
  KvScatterTargets(append->runs, kPageBytes, &page_offsets, &slots);
  ASSERT_EQ(slots.size(), history.size());

  std::vector<std::byte> batch(history.size() * g.token_bytes());
  for (size_t i = 0; i < batch.size(); ++i) batch[i] = static_cast<std::byte>(Mix64(i + 99) >> 7);
  auto src = *device->AllocBuffer(batch.size());
  ASSERT_TRUE(device->WriteBuffer(*src, 0, batch.data(), batch.size()).ok());
  ASSERT_TRUE(device->ScatterKv(g, page_offsets, slots, *src).ok());
  ASSERT_TRUE(device->Synchronize().ok());

  std::vector<std::byte> after(device->pool_bytes());
  ASSERT_TRUE(device->ReadPool(0, after.data(), after.size()).ok());
  std::vector<bool> written(after.size(), false);
  for (size_t t = 0; t < slots.size(); ++t) {
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (KvPart p : {KvPart::kKey, KvPart::kValue}) {
        const uint64_t at = page_offsets[t] + g.OffsetInPage(l, p, slots[t]);
        const uint64_t from = g.OffsetInBatch(t, l, p);
        for (uint64_t b = 0; b < g.vector_bytes(); ++b) {
          ASSERT_EQ(after[at + b], batch[from + b]) << "token " << t << " layer " << l;
          written[at + b] = true;
        }
      }
    }
  }
  for (size_t i = 0; i < after.size(); ++i) {
    if (!written[i]) {
      ASSERT_EQ(after[i], before[i]) << "byte " << i << " changed";
    }
  }
  ASSERT_TRUE(kv->CommitAppend(7, append->prefix).ok());
}

TEST(CpuDeviceTest, KernelsRejectBadArguments) {
  SimClock clock;
  auto device = *CpuDevice::Create({.pool_bytes = 1 << 16}, clock);
  auto buf = *device->AllocBuffer(1024);
  const uint64_t out_of_pool[] = {(1 << 16) - 100};
  EXPECT_EQ(device->GatherRows(out_of_pool, 256, *buf).code(), absl::StatusCode::kInvalidArgument);
  const uint64_t five[] = {0, 256, 512, 768, 1024};
  EXPECT_EQ(device->GatherRows(five, 256, *buf).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->GatherRows(five, 0, *buf).code(), absl::StatusCode::kInvalidArgument);
  KvGeometry g{.layers = 1, .kv_dim = 4, .dtype_bytes = 4, .page_bytes = 4096, .page_tokens = 128};
  const uint64_t pages[] = {0, 4096};
  const uint32_t slots[] = {0, 128};
  EXPECT_EQ(device->ScatterKv(g, pages, slots, *buf).code(), absl::StatusCode::kInvalidArgument);
  const uint32_t one_slot[] = {0};
  EXPECT_EQ(device->ScatterKv(g, pages, one_slot, *buf).code(), absl::StatusCode::kInvalidArgument);
  const uint64_t far_page[] = {1 << 16};
  EXPECT_EQ(device->ScatterKv(g, far_page, one_slot, *buf).code(),
            absl::StatusCode::kInvalidArgument);
  std::byte x[8];
  EXPECT_EQ(device->WriteBuffer(*buf, 1020, x, 8).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->ReadBuffer(*buf, 1 << 20, x, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device->AllocBuffer(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hlem::serving
