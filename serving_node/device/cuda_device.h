#pragma once
// The `cuda` Device: serving::Device over cuda::CudaPool (device/cuda/cuda_pool.h), which holds
// the cudaMalloc'd pool, the pinned staging, the copy and compute streams and the kernels. This
// adapter adds argument checks (shared with the cpu device), absl::Status, and per-purpose copy
// accounting. Built whenever nvcc is present; Create answers UNAVAILABLE on a host without a GPU.
// Thread-safe.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "serving_node/core/device.h"
#include "serving_node/device/cuda/cuda_pool.h"

namespace hlem::serving {

struct CudaDeviceOptions {
  uint64_t pool_bytes = 0;
  int device = 0;                            // CUDA device ordinal
  size_t staging_bytes_per_class = 8 << 20;  // pinned staging ring per copy class
  size_t max_piece_bytes = 1 << 20;          // larger copies are split; a multiple of 16
};

class CudaDevice final : public Device {
 public:
  // INVALID_ARGUMENT for a zero pool or staging size; UNAVAILABLE when the device is missing or
  // CUDA fails to set it up (the message says which call failed and why).
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(const CudaDeviceOptions& options);

  std::string name() const override { return pool_->name(); }
  uint64_t pool_bytes() const override { return pool_->pool_bytes(); }
  void CopyToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src, uint64_t pool_offset,
                  size_t bytes, std::function<void(absl::Status)> done) override;
  void CopyToBuffer(CopyClass cls, CopyPurpose purpose, const std::byte* src, DeviceBuffer& dst,
                    size_t offset, size_t bytes, std::function<void(absl::Status)> done) override;
  // One staged transfer and a scatter kernel per staging piece (cuda::CudaPool::CopyRowsToPool);
  // rows larger than a piece go the default way. max_copy_bytes does not apply.
  void CopyRowsToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                      std::span<const uint64_t> pool_offsets, uint32_t row_bytes,
                      size_t max_copy_bytes, std::function<void(absl::Status)> done) override;
  absl::Status ReadPool(uint64_t pool_offset, std::byte* dst, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocBuffer(size_t bytes) override;
  absl::Status WriteBuffer(DeviceBuffer& dst, size_t offset, const std::byte* src,
                           size_t bytes) override;
  absl::Status ReadBuffer(const DeviceBuffer& src, size_t offset, std::byte* dst,
                          size_t bytes) override;
  absl::Status GatherRows(std::span<const uint64_t> pool_offsets, uint32_t row_bytes,
                          DeviceBuffer& dst) override;
  absl::Status SumRows(std::span<const uint64_t> sources, uint32_t per_token, uint32_t dim,
                       const DeviceBuffer* extra, DeviceBuffer& dst) override;
  absl::Status ScatterKv(const KvGeometry& geometry, std::span<const uint64_t> page_offsets,
                         std::span<const uint32_t> slots, const DeviceBuffer& src) override;
  absl::Status Synchronize() override;
  bool critical_pending() const override { return pool_->critical_pending(); }
  DeviceCopyStats stats() const override;

  cuda::CudaPool& cuda_pool() { return *pool_; }

 private:
  CudaDevice(std::unique_ptr<cuda::CudaPool> pool, size_t max_piece_bytes)
      : pool_(std::move(pool)), max_piece_bytes_(max_piece_bytes) {}

  std::unique_ptr<cuda::CudaPool> pool_;
  const size_t max_piece_bytes_;
  mutable absl::Mutex mu_;
  DeviceCopyStats stats_ ABSL_GUARDED_BY(mu_);  // copies and bytes by purpose
};

}  // namespace hlem::serving
