// The `cuda` device through the serving::Device interface, against the `cpu` device as reference.
// Skipped where no GPU is visible (CI); run on a GPU host that has the full toolchain. On a bare
// GPU host scripts/gpu-check.sh runs the same comparisons through hlem_cuda_check.

#include "serving_node/device/cuda_device.h"

#include <cstring>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/rng.h"
#include "gtest/gtest.h"
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
    std::memcpy(cpu_->pool_data(), bytes.data(), bytes.size());
    absl::Notification done;
    absl::Status status;
    gpu_->CopyToPool(CopyClass::kBackground, CopyPurpose::kOther, bytes.data(), 0, bytes.size(),
                     [&](absl::Status s) {
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

}  // namespace
}  // namespace hlem::serving
