#pragma once
// The `cpu` Device: a host arena standing in for HBM and an EmulatedLink standing in for PCIe
// (bandwidth and latency from config), so the EMB-vs-KV trade-off exists on a machine without a
// GPU. A copy's bytes land in the arena when the emulated transfer completes. Gather and scatter
// are the reference host code of gather_scatter.h. Thread-safe (kernels on one buffer or pool
// range from two threads at once are the caller's race, as on a GPU).

#include <memory>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/huge_pages.h"
#include "serving_node/core/device.h"
#include "serving_node/core/emulated_link.h"

namespace hlem::serving {

struct CpuDeviceOptions {
  uint64_t pool_bytes = 0;
  LinkOptions link;
};

class CpuDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<CpuDevice>> Create(const CpuDeviceOptions& options,
                                                           Clock& clock);
  ~CpuDevice() override;

  std::string name() const override { return "cpu"; }
  uint64_t pool_bytes() const override { return pool_bytes_; }
  void CopyToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src, uint64_t pool_offset,
                  size_t bytes, std::function<void(absl::Status)> done) override;
  void CopyToBuffer(CopyClass cls, CopyPurpose purpose, const std::byte* src, DeviceBuffer& dst,
                    size_t offset, size_t bytes, std::function<void(absl::Status)> done) override;
  absl::Status ReadPool(uint64_t pool_offset, std::byte* dst, size_t bytes) override;
  // Host memory; the kernels run at once on the calling thread (gather_scatter.h).
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
  absl::Status Synchronize() override { return absl::OkStatus(); }
  bool critical_pending() const override { return link_->critical_pending(); }
  DeviceCopyStats stats() const override;

  // The arena itself: the CPU model runner computes on it directly.
  std::byte* pool_data() { return pool_.get(); }

 private:
  CpuDevice(uint64_t pool_bytes, HugePageBuffer pool, std::unique_ptr<EmulatedLink> link)
      : pool_bytes_(pool_bytes), pool_(std::move(pool)), link_(std::move(link)) {}

  const uint64_t pool_bytes_;
  HugePageBuffer pool_;  // on huge pages, as HBM is mapped in large pages
  std::unique_ptr<EmulatedLink> link_;
  mutable absl::Mutex mu_;
  DeviceCopyStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::serving
