#include "serving_node/device/cuda_device.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hlem::serving {
namespace {

// Buffers of another device hold host addresses: a kernel must never see one.
absl::Status CheckOwn(const char* op, const DeviceBuffer& buffer);

absl::Status ToStatus(const cuda::CudaResult& r) {
  return r.ok() ? absl::OkStatus() : absl::InternalError(r.message());
}

class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(cuda::CudaPool& pool, std::byte* data, size_t bytes)
      : pool_(pool), data_(data), bytes_(bytes) {}
  ~CudaBuffer() override { pool_.Free(data_); }
  std::byte* data() override { return data_; }
  const std::byte* data() const override { return data_; }
  size_t size() const override { return bytes_; }

 private:
  cuda::CudaPool& pool_;
  std::byte* const data_;
  const size_t bytes_;
};

absl::Status CheckOwn(const char* op, const DeviceBuffer& buffer) {
  if (dynamic_cast<const CudaBuffer*>(&buffer) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the buffer was not allocated by this cuda device"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const CudaDeviceOptions& options) {
  if (options.pool_bytes == 0) return absl::InvalidArgumentError("pool.bytes: must be > 0");
  if (options.max_piece_bytes == 0 || options.max_piece_bytes % 16 != 0 ||
      options.staging_bytes_per_class < 2 * options.max_piece_bytes) {
    return absl::InvalidArgumentError(
        "cuda.staging: max_piece_bytes must be a positive multiple of 16 and "
        "staging_bytes_per_class at least twice it");
  }
  cuda::CudaResult result = cuda::CudaResult::Ok();
  std::unique_ptr<cuda::CudaPool> pool =
      cuda::CudaPool::Create({.pool_bytes = options.pool_bytes,
                              .device = options.device,
                              .staging_bytes_per_class = options.staging_bytes_per_class,
                              .max_piece_bytes = options.max_piece_bytes},
                             &result);
  if (pool == nullptr) return absl::UnavailableError(result.message());
  return std::unique_ptr<CudaDevice>(new CudaDevice(std::move(pool), options.max_piece_bytes));
}

void CudaDevice::CopyToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                            uint64_t pool_offset, size_t bytes,
                            std::function<void(absl::Status)> done) {
  if (pool_offset > pool_bytes() || bytes > pool_bytes() - pool_offset) {
    done(
        absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes at offset ", pool_offset,
                                                " leaves the ", pool_bytes(), "-byte pool")));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.copies[static_cast<int>(purpose)];
    stats_.bytes[static_cast<int>(purpose)] += bytes;
  }
  pool_->CopyToPool(cls == CopyClass::kCritical ? cuda::CudaCopyClass::kCritical
                                                : cuda::CudaCopyClass::kBackground,
                    src, pool_offset, bytes,
                    [done = std::move(done)](cuda::CudaResult r) { done(ToStatus(r)); });
}

void CudaDevice::CopyRowsToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                                std::span<const uint64_t> pool_offsets, uint32_t row_bytes,
                                size_t max_copy_bytes, std::function<void(absl::Status)> done) {
  if (row_bytes + size_t{24} > max_piece_bytes_) {
    Device::CopyRowsToPool(cls, purpose, src, pool_offsets, row_bytes, max_copy_bytes,
                           std::move(done));
    return;
  }
  if (absl::Status st = CheckRows(pool_bytes(), pool_offsets, row_bytes); !st.ok()) {
    done(st);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.copies[static_cast<int>(purpose)];
    stats_.bytes[static_cast<int>(purpose)] += pool_offsets.size() * row_bytes;
  }
  pool_->CopyRowsToPool(cls == CopyClass::kCritical ? cuda::CudaCopyClass::kCritical
                                                    : cuda::CudaCopyClass::kBackground,
                        src, pool_offsets.data(), pool_offsets.size(), row_bytes,
                        [done = std::move(done)](cuda::CudaResult r) { done(ToStatus(r)); });
}

void CudaDevice::CopyToBuffer(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                              DeviceBuffer& dst, size_t offset, size_t bytes,
                              std::function<void(absl::Status)> done) {
  for (absl::Status st :
       {CheckOwn("CopyToBuffer", dst), CheckBufferRange("CopyToBuffer", dst, offset, bytes)}) {
    if (!st.ok()) {
      done(st);
      return;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.copies[static_cast<int>(purpose)];
    stats_.bytes[static_cast<int>(purpose)] += bytes;
  }
  pool_->CopyToDevice(cls == CopyClass::kCritical ? cuda::CudaCopyClass::kCritical
                                                  : cuda::CudaCopyClass::kBackground,
                      src, dst.data() + offset, bytes,
                      [done = std::move(done)](cuda::CudaResult r) { done(ToStatus(r)); });
}

absl::Status CudaDevice::ReadPool(uint64_t pool_offset, std::byte* dst, size_t bytes) {
  if (pool_offset > pool_bytes() || bytes > pool_bytes() - pool_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("read of ", bytes, " bytes at offset ", pool_offset, " leaves the pool"));
  }
  return ToStatus(pool_->ReadPool(pool_offset, dst, bytes));
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> CudaDevice::AllocBuffer(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocBuffer: bytes must be positive");
  std::byte* data = nullptr;
  cuda::CudaResult r = pool_->Alloc(bytes, &data);
  if (!r.ok()) return absl::ResourceExhaustedError(r.message());
  return std::make_unique<CudaBuffer>(*pool_, data, bytes);
}

absl::Status CudaDevice::WriteBuffer(DeviceBuffer& dst, size_t offset, const std::byte* src,
                                     size_t bytes) {
  if (absl::Status st = CheckOwn("WriteBuffer", dst); !st.ok()) return st;
  if (absl::Status st = CheckBufferRange("WriteBuffer", dst, offset, bytes); !st.ok()) return st;
  return ToStatus(pool_->Write(dst.data() + offset, src, bytes));
}

absl::Status CudaDevice::ReadBuffer(const DeviceBuffer& src, size_t offset, std::byte* dst,
                                    size_t bytes) {
  if (absl::Status st = CheckOwn("ReadBuffer", src); !st.ok()) return st;
  if (absl::Status st = CheckBufferRange("ReadBuffer", src, offset, bytes); !st.ok()) return st;
  return ToStatus(pool_->Read(src.data() + offset, dst, bytes));
}

absl::Status CudaDevice::GatherRows(std::span<const uint64_t> pool_offsets, uint32_t row_bytes,
                                    DeviceBuffer& dst) {
  if (absl::Status st = CheckOwn("GatherRows", dst); !st.ok()) return st;
  absl::Status st = CheckGather(pool_bytes(), pool_offsets, row_bytes, dst.size());
  if (!st.ok()) return st;
  return ToStatus(
      pool_->GatherRows(pool_offsets.data(), pool_offsets.size(), row_bytes, dst.data()));
}

absl::Status CudaDevice::SumRows(std::span<const uint64_t> sources, uint32_t per_token,
                                 uint32_t dim, const DeviceBuffer* extra, DeviceBuffer& dst) {
  if (absl::Status st = CheckOwn("SumRows", dst); !st.ok()) return st;
  if (extra != nullptr) {
    if (absl::Status st = CheckOwn("SumRows", *extra); !st.ok()) return st;
  }
  absl::Status st = CheckSum(pool_bytes(), sources, per_token, dim,
                             extra == nullptr ? 0 : extra->size(), dst.size());
  if (!st.ok()) return st;
  return ToStatus(pool_->SumRows(sources.data(), sources.size() / per_token, per_token, dim,
                                 extra == nullptr ? nullptr : extra->data(),
                                 reinterpret_cast<float*>(dst.data())));
}

absl::Status CudaDevice::ScatterKv(const KvGeometry& geometry,
                                   std::span<const uint64_t> page_offsets,
                                   std::span<const uint32_t> slots, const DeviceBuffer& src) {
  if (absl::Status st = CheckOwn("ScatterKv", src); !st.ok()) return st;
  absl::Status st = CheckScatter(pool_bytes(), geometry, page_offsets, slots, src.size());
  if (!st.ok()) return st;
  return ToStatus(
      pool_->ScatterKv(geometry, page_offsets.data(), slots.data(), slots.size(), src.data()));
}

absl::Status CudaDevice::Synchronize() { return ToStatus(pool_->Synchronize()); }

DeviceCopyStats CudaDevice::stats() const {
  DeviceCopyStats s;
  {
    absl::MutexLock lock(&mu_);
    s = stats_;
  }
  // GPU time of both classes' copies: overlapping copies count twice, so this can exceed wall
  // time when both streams are busy (an upper bound on link busy time).
  const cuda::CudaPoolStats c = pool_->stats();
  s.link_busy_ns = c.busy_ns[0] + c.busy_ns[1];
  return s;
}

}  // namespace hlem::serving
