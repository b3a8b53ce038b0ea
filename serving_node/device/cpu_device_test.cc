#include "serving_node/device/cpu_device.h"

#include <vector>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace hlem::serving
