#pragma once
// The twin's device: pool accounting without bytes, and the real EmulatedLink on the simulated
// clock for copies (critical before background, one transfer at a time, latency + bytes ÷
// bandwidth). The caches and the Refiller run against it unchanged; nothing reads pool bytes in
// the simulator, so buffers have a size and no bytes, and ReadPool, buffer reads and writes and
// kernels answer UNIMPLEMENTED.

#include <memory>
#include <string>

#include "serving_node/core/device.h"
#include "serving_node/core/emulated_link.h"

namespace hlem::sim {

class SimDevice final : public serving::Device {
 public:
  static absl::StatusOr<std::unique_ptr<SimDevice>> Create(uint64_t pool_bytes,
                                                           const serving::LinkOptions& link,
                                                           Clock& clock);

  std::string name() const override { return "sim"; }
  uint64_t pool_bytes() const override { return pool_bytes_; }
  void CopyToPool(serving::CopyClass cls, serving::CopyPurpose purpose, const std::byte* src,
                  uint64_t pool_offset, size_t bytes,
                  std::function<void(absl::Status)> done) override;
  // Over the link like CopyToPool; no bytes move.
  void CopyToBuffer(serving::CopyClass cls, serving::CopyPurpose purpose, const std::byte* src,
                    serving::DeviceBuffer& dst, size_t offset, size_t bytes,
                    std::function<void(absl::Status)> done) override;
  absl::Status ReadPool(uint64_t pool_offset, std::byte* dst, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<serving::DeviceBuffer>> AllocBuffer(size_t bytes) override;
  absl::Status WriteBuffer(serving::DeviceBuffer& dst, size_t offset, const std::byte* src,
                           size_t bytes) override;
  absl::Status ReadBuffer(const serving::DeviceBuffer& src, size_t offset, std::byte* dst,
                          size_t bytes) override;
  absl::Status GatherRows(std::span<const uint64_t> pool_offsets, uint32_t row_bytes,
                          serving::DeviceBuffer& dst) override;
  absl::Status SumRows(std::span<const uint64_t> sources, uint32_t per_token, uint32_t dim,
                       const serving::DeviceBuffer* extra, serving::DeviceBuffer& dst) override;
  absl::Status ScatterKv(const serving::KvGeometry& geometry,
                         std::span<const uint64_t> page_offsets, std::span<const uint32_t> slots,
                         const serving::DeviceBuffer& src) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  bool critical_pending() const override { return link_->critical_pending(); }
  serving::DeviceCopyStats stats() const override;

 private:
  SimDevice(uint64_t pool_bytes, std::unique_ptr<serving::EmulatedLink> link)
      : pool_bytes_(pool_bytes), link_(std::move(link)) {}
  const uint64_t pool_bytes_;
  std::unique_ptr<serving::EmulatedLink> link_;
  serving::DeviceCopyStats stats_;
};

}  // namespace hlem::sim
