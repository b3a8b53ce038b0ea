#include "serving_node/device/cpu_device.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "serving_node/device/gather_scatter.h"

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

void CpuDevice::CopyToBuffer(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                             DeviceBuffer& dst, size_t offset, size_t bytes,
                             std::function<void(absl::Status)> done) {
  if (absl::Status st = CheckBufferRange("CopyToBuffer", dst, offset, bytes); !st.ok()) {
    done(st);
    return;
  }
  link_->Submit(cls, bytes,
                [this, purpose, src, at = dst.data() + offset, bytes, done = std::move(done)] {
                  std::memcpy(at, src, bytes);
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

namespace {

class HostBuffer final : public DeviceBuffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes), data_(MakeHugePageBuffer(bytes)) {}
  std::byte* data() override { return data_.get(); }
  const std::byte* data() const override { return data_.get(); }
  size_t size() const override { return bytes_; }
  bool ok() const { return data_ != nullptr; }

 private:
  const size_t bytes_;
  HugePageBuffer data_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CpuDevice::AllocBuffer(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocBuffer: bytes must be positive");
  auto buffer = std::make_unique<HostBuffer>(bytes);
  if (!buffer->ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a ", bytes, "-byte buffer"));
  }
  return buffer;
}

absl::Status CpuDevice::WriteBuffer(DeviceBuffer& dst, size_t offset, const std::byte* src,
                                    size_t bytes) {
  if (absl::Status st = CheckBufferRange("WriteBuffer", dst, offset, bytes); !st.ok()) return st;
  std::memcpy(dst.data() + offset, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::ReadBuffer(const DeviceBuffer& src, size_t offset, std::byte* dst,
                                   size_t bytes) {
  if (absl::Status st = CheckBufferRange("ReadBuffer", src, offset, bytes); !st.ok()) return st;
  std::memcpy(dst, src.data() + offset, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::GatherRows(std::span<const uint64_t> pool_offsets, uint32_t row_bytes,
                                   DeviceBuffer& dst) {
  absl::Status st = CheckGather(pool_bytes_, pool_offsets, row_bytes, dst.size());
  if (!st.ok()) return st;
  GatherRowsHost(pool_.get(), pool_offsets.data(), pool_offsets.size(), row_bytes, dst.data());
  return absl::OkStatus();
}

absl::Status CpuDevice::SumRows(std::span<const uint64_t> sources, uint32_t per_token, uint32_t dim,
                                const DeviceBuffer* extra, DeviceBuffer& dst) {
  absl::Status st = CheckSum(pool_bytes_, sources, per_token, dim,
                             extra == nullptr ? 0 : extra->size(), dst.size());
  if (!st.ok()) return st;
  SumRowsHost(pool_.get(), extra == nullptr ? nullptr : extra->data(), sources.data(),
              sources.size() / per_token, per_token, dim, reinterpret_cast<float*>(dst.data()));
  return absl::OkStatus();
}

absl::Status CpuDevice::ScatterKv(const KvGeometry& geometry,
                                  std::span<const uint64_t> page_offsets,
                                  std::span<const uint32_t> slots, const DeviceBuffer& src) {
  absl::Status st = CheckScatter(pool_bytes_, geometry, page_offsets, slots, src.size());
  if (!st.ok()) return st;
  ScatterKvHost(geometry, pool_.get(), page_offsets.data(), slots.data(), slots.size(), src.data());
  return absl::OkStatus();
}

DeviceCopyStats CpuDevice::stats() const {
  absl::MutexLock lock(&mu_);
  DeviceCopyStats s = stats_;
  s.link_busy_ns = link_->busy_ns();
  return s;
}

}  // namespace hlem::serving
