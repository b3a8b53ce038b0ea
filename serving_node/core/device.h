#pragma once
// The device that holds the HBM pool, behind one small interface (ARCHITECTURE §4): `cpu` (a
// host arena with an emulated host->device link, so the EMB/KV trade-off exists without a GPU) and
// `cuda` (cudaMalloc pool, pinned staging, cudaMemcpyAsync on separate streams). The memory
// system and the node pipeline only see this interface.
//
// Copies are asynchronous and come in two classes: kCritical (misses of live requests) is always
// served before kBackground (refill); a background copy already on the link is not preempted, so a
// critical copy waits at most one background chunk. Every copy is counted by purpose, so tests can
// prove that an α change copies zero KV bytes. Implementations are thread-safe.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace hlem::serving {

enum class CopyClass : uint8_t { kCritical = 0, kBackground = 1 };

// Why bytes move; counted separately (hlem_node_device_copy_bytes_total{purpose}).
enum class CopyPurpose : uint8_t { kEmbMiss = 0, kEmbRefill = 1, kKv = 2, kOther = 3 };
inline constexpr int kNumCopyPurposes = 4;
const char* CopyPurposeName(CopyPurpose purpose);

struct DeviceCopyStats {
  uint64_t copies[kNumCopyPurposes] = {};
  uint64_t bytes[kNumCopyPurposes] = {};
  uint64_t link_busy_ns = 0;  // time the (emulated or real) link spent moving bytes
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
  // Reads pool bytes back to host memory synchronously (tests, tools, the CPU model runner).
  virtual absl::Status ReadPool(uint64_t pool_offset, std::byte* dst, size_t bytes) = 0;

  // True while a critical copy is queued or on the link (the refill throttler's signal).
  virtual bool critical_pending() const = 0;
  virtual DeviceCopyStats stats() const = 0;
};

}  // namespace hlem::serving
