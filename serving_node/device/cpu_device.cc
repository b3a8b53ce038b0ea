#include "serving_node/device/cpu_device.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<CpuDevice>> CpuDevice::Create(const CpuDeviceOptions& options,
                                                             Clock& clock) {
  if (options.pool_bytes == 0) return absl::InvalidArgumentError("pool.bytes: must be > 0");
  auto link = EmulatedLink::Create(options.link, clock);
  if (!link.ok()) return link.status();
  HugePageBuffer pool = MakeHugePageBuffer(options.pool_bytes);
  if (pool == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a ", options.pool_bytes, "-byte host arena"));
  }
  return std::unique_ptr<CpuDevice>(
      new CpuDevice(options.pool_bytes, std::move(pool), std::move(*link)));
}

CpuDevice::~CpuDevice() { link_.reset(); }  // no completion may touch the arena afterwards

void CpuDevice::CopyToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                           uint64_t pool_offset, size_t bytes,
                           std::function<void(absl::Status)> done) {
  if (pool_offset > pool_bytes_ || bytes > pool_bytes_ - pool_offset) {
    done(
        absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes at offset ", pool_offset,
                                                " leaves the ", pool_bytes_, "-byte pool")));
    return;
  }
  link_->Submit(cls, bytes, [this, purpose, src, pool_offset, bytes, done = std::move(done)] {
    std::memcpy(pool_.get() + pool_offset, src, bytes);
    {
      absl::MutexLock lock(&mu_);
      ++stats_.copies[static_cast<int>(purpose)];
      stats_.bytes[static_cast<int>(purpose)] += bytes;
    }
    done(absl::OkStatus());
  });
}

absl::Status CpuDevice::ReadPool(uint64_t pool_offset, std::byte* dst, size_t bytes) {
  if (pool_offset > pool_bytes_ || bytes > pool_bytes_ - pool_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("read of ", bytes, " bytes at offset ", pool_offset, " leaves the pool"));
  }
  std::memcpy(dst, pool_.get() + pool_offset, bytes);
  return absl::OkStatus();
}

DeviceCopyStats CpuDevice::stats() const {
  absl::MutexLock lock(&mu_);
  DeviceCopyStats s = stats_;
  s.link_busy_ns = link_->busy_ns();
  return s;
}

}  // namespace hlem::serving
