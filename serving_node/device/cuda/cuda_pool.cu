#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "serving_node/core/row_sources.h"
#include "serving_node/device/cuda/cuda_pool.h"

namespace hlem::cuda {
namespace {

std::string CudaError(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

#define HLEM_CUDA_RETURN(call)                                 \
  do {                                                         \
    const cudaError_t hlem_cuda_e = (call);                    \
    if (hlem_cuda_e != cudaSuccess) {                          \
      return CudaResult::Error(CudaError(#call, hlem_cuda_e)); \
    }                                                          \
  } while (0)

cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }

constexpr unsigned kThreads = 256;  // 8 warps a block
constexpr unsigned kWarpsPerBlock = kThreads / 32;

// Copies `bytes` from s to d with one warp: 16-byte vectors when both ends allow it.
__device__ void WarpCopy(const std::byte* __restrict__ s, std::byte* __restrict__ d, uint64_t bytes,
                         unsigned lane) {
  if (bytes % 16 == 0 && reinterpret_cast<uintptr_t>(s) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(d) % 16 == 0) {
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint4* d4 = reinterpret_cast<uint4*>(d);
    for (uint64_t i = lane; i < bytes / 16; i += 32) d4[i] = s4[i];
  } else {
    for (uint64_t i = lane; i < bytes; i += 32) d[i] = s[i];
  }
}

// One warp per row: dst row i = pool[offsets[i] ...].
__global__ void GatherRowsKernel(const std::byte* __restrict__ pool,
                                 const uint64_t* __restrict__ offsets, uint64_t rows,
                                 uint32_t row_bytes, std::byte* __restrict__ dst) {
  const uint64_t row = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  WarpCopy(pool + offsets[row], dst + row * row_bytes, row_bytes, threadIdx.x % 32);
}

// One warp per row: pool[offsets[i] ...] = src row i (a batch of EMB misses landing in their
// slots).
__global__ void ScatterRowsKernel(std::byte* __restrict__ pool,
                                  const uint64_t* __restrict__ offsets, uint64_t rows,
                                  uint32_t row_bytes, const std::byte* __restrict__ src) {
  const uint64_t row = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  WarpCopy(src + row * row_bytes, pool + offsets[row], row_bytes, threadIdx.x % 32);
}

// One thread per (token, dimension): the token's feature rows added in feature order from 0.0f,
// as SumRowsHost does (the same bits). A warp reads 32 consecutive floats of each row.
__global__ void SumRowsKernel(const std::byte* __restrict__ pool,
                              const std::byte* __restrict__ extra,
                              const uint64_t* __restrict__ sources, uint64_t tokens,
                              uint32_t per_token, uint32_t dim, float* __restrict__ dst) {
  const uint64_t i = uint64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (i >= tokens * dim) return;
  const uint64_t t = i / dim;
  const uint32_t d = static_cast<uint32_t>(i % dim);
  float sum = 0.0f;
  for (uint32_t f = 0; f < per_token; ++f) {
    const uint64_t source = sources[t * per_token + f];
    const std::byte* base = (source & serving::kRowInBuffer) != 0 ? extra : pool;
    sum += reinterpret_cast<const float*>(base + (source & ~serving::kRowInBuffer))[d];
  }
  dst[i] = sum;
}

constexpr size_t Align16(size_t n) { return (n + 15) / 16 * 16; }

// One warp per (token, layer, K|V) vector.
__global__ void ScatterKvKernel(serving::KvGeometry g, std::byte* __restrict__ pool,
                                const uint64_t* __restrict__ page_offsets,
                                const uint32_t* __restrict__ slots, uint64_t tokens,
                                const std::byte* __restrict__ src) {
  const uint64_t v = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const uint64_t per_token = uint64_t{g.layers} * 2;
  if (v >= tokens * per_token) return;
  const uint64_t t = v / per_token;
  const uint32_t layer = static_cast<uint32_t>((v % per_token) / 2);
  const serving::KvPart part = static_cast<serving::KvPart>(v % 2);
  WarpCopy(src + g.OffsetInBatch(t, layer, part),
           pool + page_offsets[t] + g.OffsetInPage(layer, part, slots[t]), g.vector_bytes(),
           threadIdx.x % 32);
}

// Launch limits: grid x is at most 2^31 - 1 blocks.
constexpr uint64_t kMaxWarpsPerLaunch = uint64_t{INT32_MAX} * kWarpsPerBlock;

unsigned Blocks(uint64_t warps) {
  return static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

CudaAvailability ProbeCuda(int* count, std::string* detail) {
  *count = 0;
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    if (detail != nullptr) *detail = "no CUDA driver installed";
    return CudaAvailability::kNoDevice;
  }
  const cudaError_t e = cudaGetDeviceCount(count);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && *count == 0)) {
    *count = 0;
    if (detail != nullptr) *detail = "the CUDA driver sees no device";
    return CudaAvailability::kNoDevice;
  }
  if (e != cudaSuccess) {
    *count = 0;
    if (detail != nullptr) {
      *detail = CudaError("cudaGetDeviceCount", e) + " with driver " + std::to_string(driver);
    }
    return CudaAvailability::kError;
  }
  return CudaAvailability::kAvailable;
}

int CudaToolExitCode() {
  int count = 0;
  std::string why;
  switch (ProbeCuda(&count, &why)) {
    case CudaAvailability::kAvailable:
      return 0;
    case CudaAvailability::kNoDevice:
      std::printf("SKIP: %s\n", why.c_str());
      return 77;
    case CudaAvailability::kError:
      break;
  }
  std::printf("FAIL: CUDA is installed but unusable: %s\n", why.c_str());
  return 1;
}

int CudaDeviceCount(std::string* detail) {
  int n = 0;
  ProbeCuda(&n, detail);
  return n;
}

struct CudaPool::CopyState {
  CudaCopyClass cls;
  std::function<void(CudaResult)> done;
  std::atomic<int> left{0};  // pieces not completed, plus the submitter's guard
  std::mutex mu;
  std::string error;  // first failure
};

// One staged cudaMemcpyAsync: ring bytes [off, off + bytes) (plus `reserved - bytes` skipped at
// the ring's end when it wrapped), timed by two events. `failed`: never reached the stream.
struct CudaPool::Piece {
  size_t off = 0;
  size_t bytes = 0;
  size_t reserved = 0;
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  bool failed = false;
  std::shared_ptr<CopyState> copy;
};

struct CudaPool::ClassState {
  CudaCopyClass cls = CudaCopyClass::kCritical;
  cudaStream_t stream = nullptr;
  unsigned event_flags = cudaEventDefault;
  // The pinned ring: [tail, head) in use (wrapping), `used` bytes reserved (skips included).
  // Pieces take multiples of 16 bytes, so every piece starts 16-byte aligned.
  std::byte* ring = nullptr;
  // Device memory beside the ring, byte for byte: a row batch's piece lands at the same offset
  // here before its scatter kernel (on the class's stream) puts the rows into their slots.
  std::byte* landing = nullptr;
  size_t ring_bytes = 0;
  size_t head = 0, tail = 0, used = 0;
  std::vector<cudaEvent_t> events;       // every event made, destroyed with the class
  std::vector<cudaEvent_t> free_events;  // of those, not in use
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Piece> queue;  // in stream order
  bool stop = false;
  std::thread thread;
  // Callbacks of completed copies, run in order by their own thread.
  std::mutex ready_mu;
  std::condition_variable ready_cv;
  std::deque<std::function<void()>> ready;
  bool ready_stop = false;
  std::thread callback_thread;

  // Reserves n contiguous ring bytes (n <= ring_bytes / 2); false when they are not free now.
  bool Reserve(size_t n, size_t* off, size_t* reserved) {
    if (used == 0) head = tail = 0;
    const bool full = used > 0 && head == tail;
    if (full) return false;
    if (head >= tail) {  // free: [head, ring_bytes) and [0, tail)
      if (ring_bytes - head >= n) {
        *off = head;
        *reserved = n;
      } else if (tail >= n) {
        *off = 0;
        *reserved = ring_bytes - head + n;  // skip the end of the ring
      } else {
        return false;
      }
    } else {  // free: [head, tail)
      if (tail - head < n) return false;
      *off = head;
      *reserved = n;
    }
    head = *off + n;
    if (head == ring_bytes) head = 0;
    used += *reserved;
    return true;
  }
  // Frees the oldest piece (pieces complete in ring order).
  void Release(const Piece& p) {
    used -= p.reserved;
    tail = p.off + p.bytes;
    if (tail == ring_bytes) tail = 0;
  }
  cudaError_t TakeEvents(cudaEvent_t* a, cudaEvent_t* b) {
    for (cudaEvent_t* e : {a, b}) {
      if (free_events.empty()) {
        cudaEvent_t made;
        const cudaError_t err = cudaEventCreateWithFlags(&made, event_flags);
        if (err != cudaSuccess) return err;
        events.push_back(made);
        free_events.push_back(made);
      }
      *e = free_events.back();
      free_events.pop_back();
    }
    return cudaSuccess;
  }
  void Post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(ready_mu);
      ready.push_back(std::move(fn));
    }
    ready_cv.notify_one();
  }
  void CallbackLoop() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(ready_mu);
        ready_cv.wait(lock, [&] { return ready_stop || !ready.empty(); });
        if (ready.empty()) return;
        fn = std::move(ready.front());
        ready.pop_front();
      }
      fn();
    }
  }
};

CudaPool::CudaPool(const CudaPoolOptions& options) : options_(options) {}

std::unique_ptr<CudaPool> CudaPool::Create(const CudaPoolOptions& options, CudaResult* result) {
  if (options.pool_bytes == 0 || options.max_piece_bytes == 0 ||
      options.staging_bytes_per_class < 2 * options.max_piece_bytes ||
      options.max_piece_bytes % 16 != 0 || options.kernel_scratch_bytes < 64) {
    *result = CudaResult::Error(
        "cuda pool: pool_bytes and max_piece_bytes must be positive, max_piece_bytes a multiple "
        "of 16, staging_bytes_per_class at least 2 x max_piece_bytes and kernel_scratch_bytes at "
        "least 64");
    return nullptr;
  }
  int count = 0;
  std::string detail;
  const CudaAvailability a = ProbeCuda(&count, &detail);
  if (a != CudaAvailability::kAvailable || options.device < 0 || options.device >= count) {
    *result =
        CudaResult::Error((a == CudaAvailability::kAvailable
                               ? "cuda pool: no CUDA device " + std::to_string(options.device) +
                                     " (" + std::to_string(count) + " visible)"
                               : "cuda pool: no CUDA device: " + detail));
    return nullptr;
  }
  std::unique_ptr<CudaPool> pool(new CudaPool(options));
  *result = pool->Init();
  if (!result->ok()) return nullptr;  // the destructor frees what Init made
  return pool;
}

CudaResult CudaPool::Init() {
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  cudaDeviceProp prop;
  HLEM_CUDA_RETURN(cudaGetDeviceProperties(&prop, options_.device));
  name_ = "cuda:" + std::to_string(options_.device) + " " + prop.name;
  HLEM_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&pool_), options_.pool_bytes));
  pool_bytes_ = options_.pool_bytes;
  int least = 0, greatest = 0;
  HLEM_CUDA_RETURN(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s;
  HLEM_CUDA_RETURN(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  compute_stream_ = s;
  HLEM_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  read_stream_ = s;
  HLEM_CUDA_RETURN(
      cudaMalloc(reinterpret_cast<void**>(&scratch_device_), options_.kernel_scratch_bytes));
  HLEM_CUDA_RETURN(cudaHostAlloc(reinterpret_cast<void**>(&scratch_pinned_),
                                 options_.kernel_scratch_bytes, cudaHostAllocDefault));
  cudaEvent_t ev;
  HLEM_CUDA_RETURN(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  scratch_event_ = ev;
  HLEM_CUDA_RETURN(cudaEventRecord(ev, S(compute_stream_)));
  for (int k = 0; k < 2; ++k) {
    classes_[k] = std::make_unique<ClassState>();  // owned before allocating: freed on failure
    ClassState& c = *classes_[k];
    c.cls = static_cast<CudaCopyClass>(k);
    // The critical class spins on its events (lowest latency); background sleeps on them.
    c.event_flags = k == 0 ? cudaEventDefault : cudaEventBlockingSync;
    HLEM_CUDA_RETURN(
        cudaStreamCreateWithPriority(&c.stream, cudaStreamNonBlocking, k == 0 ? greatest : least));
    HLEM_CUDA_RETURN(cudaHostAlloc(reinterpret_cast<void**>(&c.ring),
                                   options_.staging_bytes_per_class, cudaHostAllocDefault));
    c.ring_bytes = options_.staging_bytes_per_class;
    HLEM_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&c.landing), c.ring_bytes));
  }
  for (auto& c : classes_) {
    ClassState* raw = c.get();
    c->thread = std::thread([this, raw] { CompletionLoop(raw); });
    c->callback_thread = std::thread([raw] { raw->CallbackLoop(); });
  }
  return CudaResult::Ok();
}

CudaPool::~CudaPool() {
  {
    // Every copy's callback returns first; callbacks that submit more copies get "closing".
    std::unique_lock<std::mutex> lock(outstanding_mu_);
    closing_ = true;
    outstanding_cv_.wait(lock, [&] { return outstanding_ == 0; });
  }
  for (auto& c : classes_) {
    if (c == nullptr) continue;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->stop = true;
    }
    c->cv.notify_all();
    if (c->thread.joinable()) c->thread.join();
    {
      std::lock_guard<std::mutex> lock(c->ready_mu);
      c->ready_stop = true;
    }
    c->ready_cv.notify_all();
    if (c->callback_thread.joinable()) c->callback_thread.join();
  }
  cudaSetDevice(options_.device);
  if (compute_stream_ != nullptr) cudaStreamSynchronize(S(compute_stream_));
  for (auto& c : classes_) {
    if (c == nullptr) continue;
    if (c->stream != nullptr) {
      cudaStreamSynchronize(c->stream);
      cudaStreamDestroy(c->stream);
    }
    if (c->ring != nullptr) cudaFreeHost(c->ring);
    if (c->landing != nullptr) cudaFree(c->landing);
    for (cudaEvent_t e : c->events) cudaEventDestroy(e);
  }
  if (scratch_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(scratch_event_));
  if (scratch_pinned_ != nullptr) cudaFreeHost(scratch_pinned_);
  if (scratch_device_ != nullptr) cudaFree(scratch_device_);
  if (compute_stream_ != nullptr) cudaStreamDestroy(S(compute_stream_));
  if (read_stream_ != nullptr) cudaStreamDestroy(S(read_stream_));
  if (pool_ != nullptr) cudaFree(pool_);
}

void CudaPool::Finish(ClassState& c, const std::shared_ptr<CopyState>& copy) {
  if (copy->cls == CudaCopyClass::kCritical) critical_in_flight_.fetch_sub(1);
  c.Post([this, copy] {
    copy->done(copy->error.empty() ? CudaResult::Ok() : CudaResult::Error(copy->error));
    std::lock_guard<std::mutex> lock(outstanding_mu_);
    if (--outstanding_ == 0) outstanding_cv_.notify_all();
  });
}

void CudaPool::CopyToPool(CudaCopyClass cls, const std::byte* src, uint64_t pool_offset,
                          size_t bytes, std::function<void(CudaResult)> done) {
  if (pool_offset > pool_bytes_ || bytes > pool_bytes_ - pool_offset) {
    done(CudaResult::Error("CopyToPool: " + std::to_string(bytes) + " bytes at offset " +
                           std::to_string(pool_offset) + " leave the " +
                           std::to_string(pool_bytes_) + "-byte pool"));
    return;
  }
  Copy(cls, src, pool_ + pool_offset, bytes, std::move(done), "CopyToPool");
}

void CudaPool::CopyToDevice(CudaCopyClass cls, const std::byte* src, std::byte* device_dst,
                            size_t bytes, std::function<void(CudaResult)> done) {
  Copy(cls, src, device_dst, bytes, std::move(done), "CopyToDevice");
}

void CudaPool::CopyRowsToPool(CudaCopyClass cls, const std::byte* src, const uint64_t* offsets,
                              size_t rows, uint32_t row_bytes,
                              std::function<void(CudaResult)> done) {
  if (row_bytes == 0 || row_bytes + 8 + 16 > options_.max_piece_bytes) {
    done(CudaResult::Error("CopyRowsToPool: rows of " + std::to_string(row_bytes) +
                           " bytes (want 1 .. max_piece_bytes - 24)"));
    return;
  }
  for (size_t i = 0; i < rows; ++i) {
    if (offsets[i] > pool_bytes_ || row_bytes > pool_bytes_ - offsets[i]) {
      done(CudaResult::Error("CopyRowsToPool: row " + std::to_string(i) + " at offset " +
                             std::to_string(offsets[i]) + " leaves the " +
                             std::to_string(pool_bytes_) + "-byte pool"));
      return;
    }
  }
  const RowScatter scatter{offsets, rows, row_bytes};
  Copy(cls, src, nullptr, rows * row_bytes, std::move(done), "CopyRowsToPool", &scatter);
}

void CudaPool::Copy(CudaCopyClass cls, const std::byte* src, std::byte* device_dst, size_t bytes,
                    std::function<void(CudaResult)> done, const char* op,
                    const RowScatter* scatter) {
  bool closing;
  {
    std::lock_guard<std::mutex> lock(outstanding_mu_);
    closing = closing_;
    if (!closing) ++outstanding_;
  }
  if (closing) {  // outside the lock: the callback may submit again
    done(CudaResult::Error(std::string(op) + ": the pool is closing"));
    return;
  }
  ClassState& c = *classes_[static_cast<int>(cls)];
  auto copy = std::make_shared<CopyState>();
  copy->cls = cls;
  copy->done = std::move(done);
  const size_t piece_bytes = options_.max_piece_bytes;
  // A row batch's piece: its rows' offsets (padded to 16 bytes), then the rows.
  const size_t piece_rows =
      scatter == nullptr ? 0 : (piece_bytes - 16) / (size_t{scatter->row_bytes} + 8);
  const size_t pieces = scatter != nullptr ? (scatter->rows + piece_rows - 1) / piece_rows
                        : bytes == 0       ? 0
                                           : (bytes + piece_bytes - 1) / piece_bytes;
  copy->left.store(static_cast<int>(pieces) + 1);
  if (cls == CudaCopyClass::kCritical) critical_in_flight_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.copies[static_cast<int>(cls)];
    stats_.bytes[static_cast<int>(cls)] += bytes;
  }
  cudaSetDevice(options_.device);
  size_t submitted = 0;
  for (size_t off = 0, first_row = 0; submitted < pieces;) {
    size_t n = std::min(piece_bytes, bytes - off), index_bytes = 0, k = 0;
    if (scatter != nullptr) {
      k = std::min(piece_rows, scatter->rows - first_row);
      index_bytes = Align16(k * sizeof(uint64_t));
      n = index_bytes + k * scatter->row_bytes;
    }
    Piece piece;
    piece.bytes = Align16(n);
    piece.copy = copy;
    const char* failed_call = nullptr;
    cudaError_t e = cudaSuccess;
    {
      // Reserve, stage, record and enqueue under one hold of the lock: the queue (the order in
      // which the ring is freed) must be the order in which the ring was handed out.
      std::unique_lock<std::mutex> lock(c.mu);
      c.cv.wait(lock, [&] { return c.Reserve(piece.bytes, &piece.off, &piece.reserved); });
      if (scatter != nullptr) {
        std::memcpy(c.ring + piece.off, scatter->offsets + first_row, k * sizeof(uint64_t));
        std::memcpy(c.ring + piece.off + index_bytes, src + off, n - index_bytes);
      } else {
        std::memcpy(c.ring + piece.off, src + off, n);
      }
      e = c.TakeEvents(&piece.start, &piece.end);
      if (e != cudaSuccess) failed_call = "cudaEventCreate";
      if (e == cudaSuccess && (e = cudaEventRecord(piece.start, c.stream)) != cudaSuccess) {
        failed_call = "cudaEventRecord";
      }
      std::byte* land = scatter != nullptr ? c.landing + piece.off : device_dst + off;
      if (e == cudaSuccess &&
          (e = cudaMemcpyAsync(land, c.ring + piece.off, n, cudaMemcpyHostToDevice, c.stream)) !=
              cudaSuccess) {
        failed_call = "cudaMemcpyAsync";
      }
      if (e == cudaSuccess && scatter != nullptr) {
        (void)cudaGetLastError();  // clear an earlier, unrelated error of this thread
        ScatterRowsKernel<<<Blocks(k), kThreads, 0, c.stream>>>(
            pool_, reinterpret_cast<const uint64_t*>(land), k, scatter->row_bytes,
            land + index_bytes);
        if ((e = cudaGetLastError()) != cudaSuccess) failed_call = "ScatterRowsKernel";
      }
      if (e == cudaSuccess && (e = cudaEventRecord(piece.end, c.stream)) != cudaSuccess) {
        failed_call = "cudaEventRecord";
      }
      // A failed piece still goes through the queue, so the ring is released in order (after the
      // stream has drained, in case its copy was queued).
      piece.failed = e != cudaSuccess;
      c.queue.push_back(piece);
    }
    c.cv.notify_all();
    ++submitted;
    off += n - index_bytes;
    first_row += k;
    if (e != cudaSuccess) {
      std::lock_guard<std::mutex> lock(copy->mu);
      if (copy->error.empty()) copy->error = CudaError(failed_call, e);
      break;
    }
  }
  // Drop the pieces never submitted and the guard; whoever reaches zero reports.
  const int unsent = static_cast<int>(pieces - submitted) + 1;
  if (copy->left.fetch_sub(unsent) == unsent) Finish(c, copy);
}

void CudaPool::CompletionLoop(ClassState* c) {
  cudaSetDevice(options_.device);
  while (true) {
    Piece piece;
    {
      std::unique_lock<std::mutex> lock(c->mu);
      c->cv.wait(lock, [&] { return c->stop || !c->queue.empty(); });
      if (c->queue.empty()) return;  // stopping, and nothing is left in flight
      piece = c->queue.front();
    }
    cudaError_t e;
    float ms = 0;
    if (piece.failed) {
      e = cudaStreamSynchronize(c->stream);  // nothing may still read the piece's ring bytes
    } else {
      e = cudaEventSynchronize(piece.end);
      if (e == cudaSuccess) cudaEventElapsedTime(&ms, piece.start, piece.end);
    }
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->queue.pop_front();
      c->Release(piece);
      for (cudaEvent_t ev : {piece.start, piece.end}) {
        if (ev != nullptr) c->free_events.push_back(ev);
      }
    }
    c->cv.notify_all();
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.busy_ns[static_cast<int>(c->cls)] += static_cast<uint64_t>(ms * 1e6);
    }
    CopyState& copy = *piece.copy;
    if (e != cudaSuccess) {
      std::lock_guard<std::mutex> lock(copy.mu);
      if (copy.error.empty()) copy.error = CudaError("host-to-device copy", e);
    }
    if (copy.left.fetch_sub(1) == 1) Finish(*c, piece.copy);
  }
}

CudaResult CudaPool::ReadPool(uint64_t pool_offset, std::byte* dst, size_t bytes) {
  if (pool_offset > pool_bytes_ || bytes > pool_bytes_ - pool_offset) {
    return CudaResult::Error("ReadPool: " + std::to_string(bytes) + " bytes at offset " +
                             std::to_string(pool_offset) + " leave the pool");
  }
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  for (auto& c : classes_) HLEM_CUDA_RETURN(cudaStreamSynchronize(c->stream));
  HLEM_CUDA_RETURN(cudaStreamSynchronize(S(compute_stream_)));
  HLEM_CUDA_RETURN(
      cudaMemcpyAsync(dst, pool_ + pool_offset, bytes, cudaMemcpyDeviceToHost, S(read_stream_)));
  HLEM_CUDA_RETURN(cudaStreamSynchronize(S(read_stream_)));
  return CudaResult::Ok();
}

CudaResult CudaPool::Alloc(size_t bytes, std::byte** device_ptr) {
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(device_ptr), bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: later launches on this thread must not see it
    return CudaResult::Error(CudaError("cudaMalloc", e));
  }
  return CudaResult::Ok();
}

void CudaPool::Free(std::byte* device_ptr) {
  cudaSetDevice(options_.device);
  cudaFree(device_ptr);
}

CudaResult CudaPool::Write(std::byte* device_dst, const std::byte* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(kernel_mu_);
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  HLEM_CUDA_RETURN(
      cudaMemcpyAsync(device_dst, src, bytes, cudaMemcpyHostToDevice, S(compute_stream_)));
  HLEM_CUDA_RETURN(cudaStreamSynchronize(S(compute_stream_)));
  return CudaResult::Ok();
}

CudaResult CudaPool::Read(const std::byte* device_src, std::byte* dst, size_t bytes) {
  std::lock_guard<std::mutex> lock(kernel_mu_);
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  HLEM_CUDA_RETURN(
      cudaMemcpyAsync(dst, device_src, bytes, cudaMemcpyDeviceToHost, S(compute_stream_)));
  HLEM_CUDA_RETURN(cudaStreamSynchronize(S(compute_stream_)));
  return CudaResult::Ok();
}

CudaResult CudaPool::StageIndex(const void* host, size_t bytes, size_t scratch_offset,
                                void** device_ptr) {
  std::memcpy(scratch_pinned_ + scratch_offset, host, bytes);
  HLEM_CUDA_RETURN(cudaMemcpyAsync(scratch_device_ + scratch_offset,
                                   scratch_pinned_ + scratch_offset, bytes, cudaMemcpyHostToDevice,
                                   S(compute_stream_)));
  *device_ptr = scratch_device_ + scratch_offset;
  return CudaResult::Ok();
}

CudaResult CudaPool::GatherRows(const uint64_t* offsets, size_t rows, uint32_t row_bytes,
                                std::byte* device_dst) {
  std::lock_guard<std::mutex> lock(kernel_mu_);
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  const size_t per_batch =
      std::min<uint64_t>(options_.kernel_scratch_bytes / sizeof(uint64_t), kMaxWarpsPerLaunch);
  for (size_t first = 0; first < rows; first += per_batch) {
    const size_t n = std::min(per_batch, rows - first);
    // The pinned scratch is reused: wait until the previous kernel's index copy has run.
    HLEM_CUDA_RETURN(cudaEventSynchronize(static_cast<cudaEvent_t>(scratch_event_)));
    void* dev_offsets = nullptr;
    CudaResult staged = StageIndex(offsets + first, n * sizeof(uint64_t), 0, &dev_offsets);
    if (!staged.ok()) return staged;
    HLEM_CUDA_RETURN(cudaEventRecord(static_cast<cudaEvent_t>(scratch_event_), S(compute_stream_)));
    (void)cudaGetLastError();  // clear an earlier, unrelated error of this thread
    GatherRowsKernel<<<Blocks(n), kThreads, 0, S(compute_stream_)>>>(
        pool_, static_cast<const uint64_t*>(dev_offsets), n, row_bytes,
        device_dst + first * row_bytes);
    HLEM_CUDA_RETURN(cudaGetLastError());
  }
  std::lock_guard<std::mutex> stats_lock(stats_mu_);
  stats_.gathered_rows += rows;
  return CudaResult::Ok();
}

CudaResult CudaPool::GatherRowsDevice(const uint64_t* device_offsets, size_t rows,
                                      uint32_t row_bytes, std::byte* device_dst) {
  std::lock_guard<std::mutex> lock(kernel_mu_);
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  for (size_t first = 0; first < rows; first += kMaxWarpsPerLaunch) {
    const size_t n = std::min<uint64_t>(kMaxWarpsPerLaunch, rows - first);
    (void)cudaGetLastError();
    GatherRowsKernel<<<Blocks(n), kThreads, 0, S(compute_stream_)>>>(
        pool_, device_offsets + first, n, row_bytes, device_dst + first * row_bytes);
    HLEM_CUDA_RETURN(cudaGetLastError());
  }
  std::lock_guard<std::mutex> stats_lock(stats_mu_);
  stats_.gathered_rows += rows;
  return CudaResult::Ok();
}

CudaResult CudaPool::SumRows(const uint64_t* sources, size_t tokens, uint32_t per_token,
                             uint32_t dim, const std::byte* device_extra, float* device_dst) {
  std::lock_guard<std::mutex> lock(kernel_mu_);
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  if (sizeof(uint64_t) * uint64_t{per_token} > options_.kernel_scratch_bytes) {
    return CudaResult::Error("SumRows: one token's " + std::to_string(per_token) +
                             " sources do not fit the kernel scratch");
  }
  // Tokens per launch: their sources fit the scratch, their threads one grid.
  const uint64_t max_threads = uint64_t{INT32_MAX} * kThreads;
  const size_t per_batch = std::min<uint64_t>(
      options_.kernel_scratch_bytes / (sizeof(uint64_t) * uint64_t{per_token}), max_threads / dim);
  for (size_t first = 0; first < tokens; first += per_batch) {
    const size_t n = std::min(per_batch, tokens - first);
    HLEM_CUDA_RETURN(cudaEventSynchronize(static_cast<cudaEvent_t>(scratch_event_)));
    void* dev_sources = nullptr;
    CudaResult staged =
        StageIndex(sources + first * per_token, n * per_token * sizeof(uint64_t), 0, &dev_sources);
    if (!staged.ok()) return staged;
    HLEM_CUDA_RETURN(cudaEventRecord(static_cast<cudaEvent_t>(scratch_event_), S(compute_stream_)));
    (void)cudaGetLastError();
    const uint64_t threads = uint64_t{n} * dim;
    SumRowsKernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0,
                    S(compute_stream_)>>>(pool_, device_extra,
                                          static_cast<const uint64_t*>(dev_sources), n, per_token,
                                          dim, device_dst + first * dim);
    HLEM_CUDA_RETURN(cudaGetLastError());
  }
  std::lock_guard<std::mutex> stats_lock(stats_mu_);
  stats_.summed_tokens += tokens;
  return CudaResult::Ok();
}

CudaResult CudaPool::ScatterKv(const serving::KvGeometry& g, const uint64_t* page_offsets,
                               const uint32_t* slots, size_t tokens, const std::byte* device_src) {
  std::lock_guard<std::mutex> lock(kernel_mu_);
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  // Scratch: page offsets first, slots after them (16-byte aligned).
  const uint64_t vectors_per_token = uint64_t{g.layers} * 2;
  const size_t per_batch = std::min<uint64_t>(
      (options_.kernel_scratch_bytes - 16) / (sizeof(uint64_t) + sizeof(uint32_t)),
      kMaxWarpsPerLaunch / vectors_per_token);
  for (size_t first = 0; first < tokens; first += per_batch) {
    const size_t n = std::min(per_batch, tokens - first);
    HLEM_CUDA_RETURN(cudaEventSynchronize(static_cast<cudaEvent_t>(scratch_event_)));
    void* dev_pages = nullptr;
    void* dev_slots = nullptr;
    const size_t slots_at = (n * sizeof(uint64_t) + 15) / 16 * 16;
    CudaResult staged = StageIndex(page_offsets + first, n * sizeof(uint64_t), 0, &dev_pages);
    if (staged.ok()) staged = StageIndex(slots + first, n * sizeof(uint32_t), slots_at, &dev_slots);
    if (!staged.ok()) return staged;
    HLEM_CUDA_RETURN(cudaEventRecord(static_cast<cudaEvent_t>(scratch_event_), S(compute_stream_)));
    (void)cudaGetLastError();
    ScatterKvKernel<<<Blocks(n * vectors_per_token), kThreads, 0, S(compute_stream_)>>>(
        g, pool_, static_cast<const uint64_t*>(dev_pages), static_cast<const uint32_t*>(dev_slots),
        n, device_src + first * g.token_bytes());
    HLEM_CUDA_RETURN(cudaGetLastError());
  }
  std::lock_guard<std::mutex> stats_lock(stats_mu_);
  stats_.scattered_tokens += tokens;
  return CudaResult::Ok();
}

CudaResult CudaPool::Synchronize() {
  HLEM_CUDA_RETURN(cudaSetDevice(options_.device));
  HLEM_CUDA_RETURN(cudaStreamSynchronize(S(compute_stream_)));
  return CudaResult::Ok();
}

CudaPoolStats CudaPool::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace hlem::cuda
