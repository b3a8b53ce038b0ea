#include "sim/twin/sim_device.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hlem::sim {
namespace {

absl::Status NoBytes(const char* op) {
  return absl::UnimplementedError(absl::StrCat(op, ": the simulated device holds no bytes"));
}

// A buffer of a size and no bytes: a destination for CopyToBuffer.
class SimBuffer final : public serving::DeviceBuffer {
 public:
  explicit SimBuffer(size_t bytes) : bytes_(bytes) {}
  std::byte* data() override { return nullptr; }
  const std::byte* data() const override { return nullptr; }
  size_t size() const override { return bytes_; }

 private:
  const size_t bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SimDevice>> SimDevice::Create(uint64_t pool_bytes,
                                                             const serving::LinkOptions& link,
                                                             Clock& clock) {
  absl::StatusOr<std::unique_ptr<serving::EmulatedLink>> l =
      serving::EmulatedLink::Create(link, clock);
  if (!l.ok()) return l.status();
  return std::unique_ptr<SimDevice>(new SimDevice(pool_bytes, std::move(*l)));
}

void SimDevice::CopyToPool(serving::CopyClass cls, serving::CopyPurpose purpose,
                           const std::byte* /*src*/, uint64_t pool_offset, size_t bytes,
                           std::function<void(absl::Status)> done) {
  if (pool_offset > pool_bytes_ || bytes > pool_bytes_ - pool_offset) {
    done(absl::InvalidArgumentError(absl::StrCat("CopyToPool: [", pool_offset, ", +", bytes,
                                                 ") leaves the pool of ", pool_bytes_, " bytes")));
    return;
  }
  const int p = static_cast<int>(purpose);
  ++stats_.copies[p];
  stats_.bytes[p] += bytes;
  link_->Submit(cls, bytes, [done = std::move(done)] { done(absl::OkStatus()); });
}

void SimDevice::CopyToBuffer(serving::CopyClass cls, serving::CopyPurpose purpose,
                             const std::byte* /*src*/, serving::DeviceBuffer& dst, size_t offset,
                             size_t bytes, std::function<void(absl::Status)> done) {
  if (absl::Status st = serving::CheckBufferRange("CopyToBuffer", dst, offset, bytes); !st.ok()) {
    done(st);
    return;
  }
  const int p = static_cast<int>(purpose);
  ++stats_.copies[p];
  stats_.bytes[p] += bytes;
  link_->Submit(cls, bytes, [done = std::move(done)] { done(absl::OkStatus()); });
}

absl::Status SimDevice::ReadPool(uint64_t, std::byte*, size_t) { return NoBytes("ReadPool"); }
absl::StatusOr<std::unique_ptr<serving::DeviceBuffer>> SimDevice::AllocBuffer(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocBuffer: bytes must be positive");
  return std::make_unique<SimBuffer>(bytes);
}
absl::Status SimDevice::WriteBuffer(serving::DeviceBuffer&, size_t, const std::byte*, size_t) {
  return NoBytes("WriteBuffer");
}
absl::Status SimDevice::ReadBuffer(const serving::DeviceBuffer&, size_t, std::byte*, size_t) {
  return NoBytes("ReadBuffer");
}
absl::Status SimDevice::GatherRows(std::span<const uint64_t>, uint32_t, serving::DeviceBuffer&) {
  return NoBytes("GatherRows");
}
absl::Status SimDevice::SumRows(std::span<const uint64_t>, uint32_t, uint32_t,
                                const serving::DeviceBuffer*, serving::DeviceBuffer&) {
  return NoBytes("SumRows");
}
absl::Status SimDevice::ScatterKv(const serving::KvGeometry&, std::span<const uint64_t>,
                                  std::span<const uint32_t>, const serving::DeviceBuffer&) {
  return NoBytes("ScatterKv");
}

serving::DeviceCopyStats SimDevice::stats() const {
  serving::DeviceCopyStats s = stats_;
  s.link_busy_ns = link_->busy_ns();
  return s;
}

}  // namespace hlem::sim
