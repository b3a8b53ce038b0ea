#pragma once
// The CUDA side of the `cuda` device (ARCHITECTURE §4), with no dependency beyond the CUDA runtime
// and the standard library, so that scripts/gpu-check.sh can build and run it on a bare GPU host.
// serving_node/device/cuda_device.h adapts it to the serving::Device interface.
//
// - One cudaMalloc'd pool (the HBM pool the HbmPool's pages index).
// - Host-to-pool copies staged through pinned memory: the caller's bytes are copied into a pinned
//   ring of the copy's class on the submitting thread (pieces of at most max_piece_bytes, carved
//   contiguously, so a 256 B miss takes 256 B of it), then cudaMemcpyAsync'd on the class's
//   stream: critical copies (misses of live requests) and background copies (refill) on two
//   streams, so a critical copy never queues behind background copies in one stream. The hardware
//   does not order copies by stream priority; the refill throttler keeps background traffic out of
//   the way (one chunk in flight, none while critical_pending()).
// - Completions: a thread per class waits for each piece's event in stream order (so the ring is
//   freed in the order it was filled) and hands the copy's callback to a callback thread of the
//   class. Callbacks therefore never run on the submitter's thread (except for a range error,
//   reported at once) nor on the thread that frees staging, and may submit more copies.
// - The destructor waits until every copy's callback has returned; copies submitted meanwhile (by
//   callbacks) fail at once with "pool closing". Never destroy the pool from one of its callbacks
//   (it would wait for itself).
// - Kernels (GatherRows, SumRows, ScatterKv) on one compute stream created with the highest
//   priority, in issue order; Synchronize waits for them. Their semantics are those of
//   gather_scatter.h.
//
// Errors are returned as CudaResult (ok, or a message that names the call and CUDA's error).
// Thread-safe.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serving_node/core/kv_geometry.h"

namespace hlem::cuda {

class CudaResult {
 public:
  static CudaResult Ok() { return CudaResult(); }
  static CudaResult Error(std::string message) { return CudaResult(std::move(message)); }
  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  CudaResult() = default;
  explicit CudaResult(std::string message)
      : message_(message.empty() ? "unknown CUDA error" : std::move(message)) {}
  std::string message_;
};

struct CudaPoolOptions {
  uint64_t pool_bytes = 0;
  int device = 0;                            // CUDA device ordinal
  size_t staging_bytes_per_class = 8 << 20;  // pinned ring per copy class (submitters wait if full)
  size_t max_piece_bytes = 1 << 20;          // larger copies are split; at most half the ring
  size_t kernel_scratch_bytes = 16 << 20;    // device + pinned scratch for kernel index arrays
};

enum class CudaCopyClass : int { kCritical = 0, kBackground = 1 };

struct CudaPoolStats {
  uint64_t copies[2] = {0, 0};  // by CudaCopyClass
  uint64_t bytes[2] = {0, 0};
  uint64_t busy_ns[2] = {0, 0};  // GPU time of each class's copies (events around each piece)
  uint64_t gathered_rows = 0;
  uint64_t summed_tokens = 0;
  uint64_t scattered_tokens = 0;
};

// Whether this process can use a GPU: kAvailable (count > 0), kNoDevice (no CUDA driver installed,
// or a driver that sees no device: skip), kError (a driver is there but CUDA fails, for example a
// driver too old for this runtime: a real failure on a GPU host). *detail says what CUDA said.
enum class CudaAvailability { kAvailable, kNoDevice, kError };
CudaAvailability ProbeCuda(int* count, std::string* detail);
// Devices usable now (0 for kNoDevice and kError).
int CudaDeviceCount(std::string* detail = nullptr);

// A device's name as a file name: "cuda:0 NVIDIA H200" or "NVIDIA H200" -> "nvidia-h200" (the
// GPU tools' sim/costs/<device>*.csv).
inline std::string DeviceSlug(const std::string& name) {
  const size_t colon = name.find(':');
  const size_t space = name.find(' ');
  const std::string s = colon != std::string::npos && space != std::string::npos && colon < space
                            ? name.substr(space + 1)
                            : name;
  std::string out;
  for (char c : s) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (alnum) {
      out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "gpu" : out;
}
// For the GPU tools: 0 when a device is usable; otherwise prints "SKIP: why" and returns 77 (no
// driver or no device), or prints "FAIL: ..." and returns 1 (CUDA installed but unusable).
int CudaToolExitCode();

class CudaPool {
 public:
  // Allocates the pool, the staging rings, the scratch and the streams on options.device.
  static std::unique_ptr<CudaPool> Create(const CudaPoolOptions& options, CudaResult* result);
  ~CudaPool();  // waits until every copy's callback has returned
  CudaPool(const CudaPool&) = delete;
  CudaPool& operator=(const CudaPool&) = delete;

  const std::string& name() const { return name_; }  // "cuda:0 NVIDIA H200"
  uint64_t pool_bytes() const { return pool_bytes_; }
  std::byte* pool() { return pool_; }  // device address

  // Copies host bytes into the pool; `done` runs once, on the class's callback thread, with the
  // outcome (inline for a range error or a closing pool). `src` may be reused as soon as
  // CopyToPool returns (it is staged before). Blocks while the class's staging ring is full.
  void CopyToPool(CudaCopyClass cls, const std::byte* src, uint64_t pool_offset, size_t bytes,
                  std::function<void(CudaResult)> done);
  // The same into a buffer from Alloc (rows a request uses without caching them).
  void CopyToDevice(CudaCopyClass cls, const std::byte* src, std::byte* device_dst, size_t bytes,
                    std::function<void(CudaResult)> done);
  // Copies `rows` rows of `row_bytes` from host memory (row i at src + i * row_bytes) into the
  // pool at offsets[i], as one copy: each piece stages its rows' offsets and bytes together, one
  // cudaMemcpyAsync lands them in device memory and a kernel on the same stream scatters the rows
  // to their slots. Misses of a request land in scattered slots: this costs one transfer where
  // CopyToPool per row costs one each. `done` as for CopyToPool (an error inline for a row that
  // leaves the pool, or rows of 0 or more than max_piece_bytes - 24 bytes); `src` and `offsets`
  // may be reused as soon as it returns. The rows' slots must not overlap.
  void CopyRowsToPool(CudaCopyClass cls, const std::byte* src, const uint64_t* offsets, size_t rows,
                      uint32_t row_bytes, std::function<void(CudaResult)> done);
  // Copies pool bytes to host memory, after every copy submitted before and every kernel.
  CudaResult ReadPool(uint64_t pool_offset, std::byte* dst, size_t bytes);
  // Critical copies submitted and not yet completed.
  bool critical_pending() const { return critical_in_flight_.load() > 0; }

  // Device buffers for kernel inputs and outputs.
  CudaResult Alloc(size_t bytes, std::byte** device_ptr);
  void Free(std::byte* device_ptr);
  // Synchronous host <-> device buffer copies, ordered after the kernels issued before.
  CudaResult Write(std::byte* device_dst, const std::byte* src, size_t bytes);
  CudaResult Read(const std::byte* device_src, std::byte* dst, size_t bytes);

  // Kernels; the caller has checked the arguments (device.h's CheckGather / CheckScatter).
  CudaResult GatherRows(const uint64_t* offsets, size_t rows, uint32_t row_bytes,
                        std::byte* device_dst);
  // The same with the offsets already in device memory (no index copy over the link).
  CudaResult GatherRowsDevice(const uint64_t* device_offsets, size_t rows, uint32_t row_bytes,
                              std::byte* device_dst);
  // Token sums (serving::Device::SumRows, reference SumRowsHost): `sources` (tokens × per_token,
  // host memory) name pool offsets or, with serving::kRowInBuffer, offsets into device_extra.
  CudaResult SumRows(const uint64_t* sources, size_t tokens, uint32_t per_token, uint32_t dim,
                     const std::byte* device_extra, float* device_dst);
  CudaResult ScatterKv(const serving::KvGeometry& geometry, const uint64_t* page_offsets,
                       const uint32_t* slots, size_t tokens, const std::byte* device_src);
  CudaResult Synchronize();

  CudaPoolStats stats() const;

 private:
  struct Piece;        // one staged cudaMemcpyAsync
  struct CopyState;    // one CopyToPool, split into pieces
  struct ClassState;   // a copy class: stream, staging blocks, completion thread
  struct RowScatter {  // CopyRowsToPool's rows
    const uint64_t* offsets;
    size_t rows;
    uint32_t row_bytes;
  };

  explicit CudaPool(const CudaPoolOptions& options);
  CudaResult Init();
  void CompletionLoop(ClassState* c);
  // Stages and enqueues one copy in pieces (CopyToPool and CopyToDevice; CopyRowsToPool with
  // `scatter`, device_dst unused); `op` names it in errors.
  void Copy(CudaCopyClass cls, const std::byte* src, std::byte* device_dst, size_t bytes,
            std::function<void(CudaResult)> done, const char* op,
            const RowScatter* scatter = nullptr);
  // Reports a copy's outcome on its class's callback thread and counts it finished.
  void Finish(ClassState& c, const std::shared_ptr<CopyState>& copy);
  // Copies an index array into the kernel scratch (pinned, then device) on the compute stream.
  CudaResult StageIndex(const void* host, size_t bytes, size_t scratch_offset, void** device_ptr);

  const CudaPoolOptions options_;
  std::string name_;
  uint64_t pool_bytes_ = 0;
  std::byte* pool_ = nullptr;
  void* compute_stream_ = nullptr;  // cudaStream_t
  void* read_stream_ = nullptr;
  std::byte* scratch_device_ = nullptr;
  std::byte* scratch_pinned_ = nullptr;
  void* scratch_event_ = nullptr;  // the last kernel that read the scratch
  std::mutex kernel_mu_;           // one kernel launch (and scratch use) at a time
  std::unique_ptr<ClassState> classes_[2];
  std::atomic<int64_t> critical_in_flight_{0};
  // Copies whose callback has not returned yet; the destructor waits for 0.
  std::mutex outstanding_mu_;
  std::condition_variable outstanding_cv_;
  int64_t outstanding_ = 0;
  bool closing_ = false;
  mutable std::mutex stats_mu_;
  CudaPoolStats stats_;
};

}  // namespace hlem::cuda
