#pragma once
// The device that holds the HBM pool, behind one small interface (ARCHITECTURE §4): `cpu` (a
// host arena with an emulated host->device link, so the EMB/KV trade-off exists without a GPU) and
// `cuda` (cudaMalloc pool, pinned staging, cudaMemcpyAsync on separate streams). The memory
// system and the node pipeline only see this interface.
//
// Copies are asynchronous and come in two classes: kCritical (misses of live requests) is always
// served before kBackground (refill); a background copy already on the link is not preempted, so a
// critical copy waits at most one background chunk. Every copy is counted by purpose, so tests can
// prove that an α change copies zero KV bytes.
//
// Kernels. GatherRows (EMB rows from their slots into a contiguous batch), SumRows (a token's
// feature rows summed into the model's input) and ScatterKv (a step's new K/V into page slots)
// move bytes inside the device, never over the link. They run in issue
// order on the device's compute stream (at once on `cpu`); their results are visible to later
// kernels, and to the host after Synchronize. Their reference semantics are the host functions
// of device/gather_scatter.h, which the `cpu` device runs. Implementations are thread-safe.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "serving_node/core/kv_geometry.h"
#include "serving_node/core/row_sources.h"

namespace hlem::serving {

enum class CopyClass : uint8_t { kCritical = 0, kBackground = 1 };

// Why bytes move; counted separately (hlem_node_device_copy_bytes_total{purpose}).
enum class CopyPurpose : uint8_t { kEmbMiss = 0, kEmbRefill = 1, kKv = 2, kOther = 3 };
inline constexpr int kNumCopyPurposes = 4;
const char* CopyPurposeName(CopyPurpose purpose);

class DeviceBuffer;
// INVALID_ARGUMENT when [offset, offset + bytes) leaves the buffer; `op` names the caller.
absl::Status CheckBufferRange(const char* op, const DeviceBuffer& buffer, size_t offset,
                              size_t bytes);
// The checks every device makes before a kernel (shared, so `cpu` and `cuda` reject alike).
// Device::CopyRowsToPool's arguments: INVALID_ARGUMENT for rows of 0 bytes or a row leaving
// the pool.
absl::Status CheckRows(uint64_t pool_bytes, std::span<const uint64_t> pool_offsets,
                       uint32_t row_bytes);
absl::Status CheckGather(uint64_t pool_bytes, std::span<const uint64_t> pool_offsets,
                         uint32_t row_bytes, size_t dst_bytes);
// Device::SumRows' arguments (extra_bytes 0 when there is no extra buffer).
absl::Status CheckSum(uint64_t pool_bytes, std::span<const uint64_t> sources, uint32_t per_token,
                      uint32_t dim, size_t extra_bytes, size_t dst_bytes);
absl::Status CheckScatter(uint64_t pool_bytes, const KvGeometry& geometry,
                          std::span<const uint64_t> page_offsets, std::span<const uint32_t> slots,
                          size_t src_bytes);

struct DeviceCopyStats {
  uint64_t copies[kNumCopyPurposes] = {};
  uint64_t bytes[kNumCopyPurposes] = {};
  uint64_t link_busy_ns = 0;  // time the (emulated or real) link spent moving bytes
};

// Device memory outside the pool: kernel inputs and outputs (a gathered EMB batch, new K/V).
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual std::byte* data() = 0;  // a device address (a host address on `cpu`)
  virtual const std::byte* data() const = 0;
  virtual size_t size() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0", ...
  virtual uint64_t pool_bytes() const = 0;

  // Copies `bytes` from host memory `src` (kept alive by the caller until `done` runs) into the
  // pool at `pool_offset`; `done` runs once with the outcome, on a device thread or inside the
  // clock for simulated devices. INVALID_ARGUMENT (via done) when the range leaves the pool.
  virtual void CopyToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                          uint64_t pool_offset, size_t bytes,
                          std::function<void(absl::Status)> done) = 0;
  // The same into a buffer from AllocBuffer, at `offset`: rows a request uses without caching
  // them still cross the link (a device computes on device memory). INVALID_ARGUMENT (via done)
  // when the range leaves the buffer.
  virtual void CopyToBuffer(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                            DeviceBuffer& dst, size_t offset, size_t bytes,
                            std::function<void(absl::Status)> done) = 0;
  // Copies rows of `row_bytes` from host memory (row i at src + i * row_bytes, kept alive by the
  // caller until `done` runs) to the pool at pool_offsets[i] (read before the call returns; the
  // slots must not overlap): a request's EMB misses, landing in scattered slots. `done` runs once.
  // This default issues one CopyToPool per run of consecutive slots of at most max_copy_bytes
  // (what the emulated link charges per-transfer latency for); the cuda device overrides it with
  // one staged transfer and a scatter kernel. INVALID_ARGUMENT (via done, nothing copied) when a
  // row leaves the pool or row_bytes is 0.
  virtual void CopyRowsToPool(CopyClass cls, CopyPurpose purpose, const std::byte* src,
                              std::span<const uint64_t> pool_offsets, uint32_t row_bytes,
                              size_t max_copy_bytes, std::function<void(absl::Status)> done);
  // Reads pool bytes back to host memory synchronously (tests, tools, the CPU model runner).
  virtual absl::Status ReadPool(uint64_t pool_offset, std::byte* dst, size_t bytes) = 0;

  // A buffer of `bytes` (> 0) in device memory; RESOURCE_EXHAUSTED when the device has no room.
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocBuffer(size_t bytes) = 0;
  // Synchronous copies between host memory and a buffer (after every kernel issued before).
  // INVALID_ARGUMENT when the range leaves the buffer.
  virtual absl::Status WriteBuffer(DeviceBuffer& dst, size_t offset, const std::byte* src,
                                   size_t bytes) = 0;
  virtual absl::Status ReadBuffer(const DeviceBuffer& src, size_t offset, std::byte* dst,
                                  size_t bytes) = 0;

  // Gathers rows of `row_bytes` from pool offsets into dst: row i at dst[i * row_bytes].
  // INVALID_ARGUMENT when a row leaves the pool or the rows do not fit dst.
  virtual absl::Status GatherRows(std::span<const uint64_t> pool_offsets, uint32_t row_bytes,
                                  DeviceBuffer& dst) = 0;
  // The model's embedding input, summed where the rows are (no read-back to the host): for token
  // t < sources.size() / per_token, dst's floats [t·dim, (t + 1)·dim) = the sum over f <
  // per_token of the `dim` floats at sources[t·per_token + f], added in f order starting from
  // 0.0f (SumRowsHost, so every device gives the same bits). A source is a byte offset into the
  // pool or, with kRowInBuffer set, into `extra`; every row is 4-byte aligned. INVALID_ARGUMENT
  // when sources is empty or not whole tokens, per_token or dim is 0, a row leaves the pool or
  // `extra` (or names an `extra` that is null), an offset is not 4-byte aligned, or the sums do
  // not fit dst.
  virtual absl::Status SumRows(std::span<const uint64_t> sources, uint32_t per_token, uint32_t dim,
                               const DeviceBuffer* extra, DeviceBuffer& dst) = 0;
  // Scatters the K/V of page_offsets.size() new tokens from src (token-major, as
  // KvGeometry::OffsetInBatch) to slot slots[t] of the page at pool offset page_offsets[t].
  // INVALID_ARGUMENT when the spans differ in length, a slot is past page_tokens, a page leaves
  // the pool, or src is too small.
  virtual absl::Status ScatterKv(const KvGeometry& geometry, std::span<const uint64_t> page_offsets,
                                 std::span<const uint32_t> slots, const DeviceBuffer& src) = 0;
  // Waits for every kernel issued so far.
  virtual absl::Status Synchronize() = 0;

  // True while a critical copy is queued or on the link (the refill throttler's signal).
  virtual bool critical_pending() const = 0;
  virtual DeviceCopyStats stats() const = 0;
};

}  // namespace hlem::serving
