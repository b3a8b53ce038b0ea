// Measures what the simulator needs to know about a GPU (issue 3) and writes it to
// <out>/<device>.csv (for example sim/costs/nvidia-h200.csv): pinned host-to-device bandwidth
// alone and while kernels run, through the pool's staged copy path, gather rows/s for 256 B and
// 2 KiB rows, and the latency of a request's misses (64 critical copies of 256 B) alone, next to
// unthrottled refill traffic, and next to refill throttled as the Refiller does it (one chunk in
// flight, none issued while a critical copy is pending, a token bucket). Medians and P99 of
// repeated runs; wall-clock with steady_clock around synchronised work, CUDA events for the raw
// copies.
//
//   hlem_cuda_costs [--out DIR] [--quick]
// Exit 77 without a device (nothing written).

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "serving_node/device/cuda/cuda_pool.h"

namespace hlem::cuda {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "hlem_cuda_costs: %s\n", what.c_str());
  std::exit(1);
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}
void Check(const CudaResult& r, const char* what) {
  if (!r.ok()) Die(std::string(what) + ": " + r.message());
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[static_cast<size_t>((v.size() - 1) * p)];
}

struct Row {
  std::string metric;
  double value;
  std::string unit;
  std::string note;
};

// Raw cudaMemcpyAsync from pinned memory into the pool: GB/s over `total` bytes in `chunk` copies,
// timed with events on one stream.
double RawPinnedH2D(CudaPool& pool, size_t chunk, size_t total, cudaStream_t stream) {
  std::byte* pinned = nullptr;
  Check(cudaHostAlloc(reinterpret_cast<void**>(&pinned), chunk, cudaHostAllocDefault), "pinned");
  cudaEvent_t a, b;
  Check(cudaEventCreate(&a), "event");
  Check(cudaEventCreate(&b), "event");
  Check(cudaEventRecord(a, stream), "record");
  for (size_t done = 0; done < total; done += chunk) {
    Check(cudaMemcpyAsync(pool.pool() + (done % (pool.pool_bytes() - chunk)), pinned, chunk,
                          cudaMemcpyHostToDevice, stream),
          "memcpy");
  }
  Check(cudaEventRecord(b, stream), "record");
  Check(cudaEventSynchronize(b), "sync");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, a, b), "elapsed");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFreeHost(pinned);
  return static_cast<double>(total) / (ms / 1e3) / 1e9;
}

// Keeps the compute stream busy with gathers until destroyed. The offsets are copied to the device
// once, so the load puts no traffic on the host-to-device link being measured.
class KernelLoad {
 public:
  explicit KernelLoad(CudaPool& pool) : pool_(pool) {
    std::vector<uint64_t> rows(kRows);
    std::mt19937_64 rng(3);
    for (auto& r : rows) r = (rng() % (pool.pool_bytes() / 2048 - 1)) * 2048;
    Check(pool.Alloc(kRows * 2048, &dst_), "alloc");
    Check(pool.Alloc(kRows * sizeof(uint64_t), &offsets_), "alloc");
    Check(pool.Write(offsets_, reinterpret_cast<const std::byte*>(rows.data()),
                     kRows * sizeof(uint64_t)),
          "write offsets");
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        Check(
            pool_.GatherRowsDevice(reinterpret_cast<const uint64_t*>(offsets_), kRows, 2048, dst_),
            "gather");
        Check(pool_.Synchronize(), "sync");
        ++batches_;
      }
    });
  }
  ~KernelLoad() {
    stop_ = true;
    thread_.join();
    pool_.Free(dst_);
    pool_.Free(offsets_);
  }
  uint64_t batches() const { return batches_.load(); }

 private:
  static constexpr size_t kRows = 1 << 20;
  CudaPool& pool_;
  std::byte* dst_ = nullptr;
  std::byte* offsets_ = nullptr;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> batches_{0};
  std::thread thread_;
};

// End-to-end CopyToPool throughput (host staging memcpy included), background class.
double StagedCopyGBps(CudaPool& pool, size_t chunk, size_t total) {
  std::vector<std::byte> src(chunk, std::byte{1});
  std::mutex mu;
  std::condition_variable cv;
  size_t outstanding = 0;
  const auto t0 = Clock::now();
  for (size_t done = 0; done < total; done += chunk) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++outstanding;
    }
    pool.CopyToPool(CudaCopyClass::kBackground, src.data(), done % (pool.pool_bytes() - chunk),
                    chunk, [&](CudaResult r) {
                      Check(r, "staged copy");
                      std::lock_guard<std::mutex> lock(mu);
                      --outstanding;
                      cv.notify_all();
                    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return outstanding == 0; });
  return static_cast<double>(total) / std::chrono::duration<double>(Clock::now() - t0).count() /
         1e9;
}

// Gather rows/s: batches of `batch` rows of `row_bytes` at random row-aligned offsets.
double GatherRowsPerSecond(CudaPool& pool, uint32_t row_bytes, size_t batch, int reps) {
  std::vector<uint64_t> offsets(batch);
  std::mt19937_64 rng(row_bytes);
  const uint64_t slots = pool.pool_bytes() / row_bytes;
  std::byte* dst = nullptr;
  Check(pool.Alloc(batch * row_bytes, &dst), "alloc");
  std::vector<double> per_s;
  for (int r = 0; r < reps; ++r) {
    for (auto& o : offsets) o = (rng() % slots) * row_bytes;
    Check(pool.Synchronize(), "sync");
    const auto t0 = Clock::now();
    Check(pool.GatherRows(offsets.data(), batch, row_bytes, dst), "gather");
    Check(pool.Synchronize(), "sync");
    per_s.push_back(batch / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  pool.Free(dst);
  return Median(per_s);
}

// The device's copy ceiling: cudaMemcpyAsync between two device buffers of `bytes`, counting bytes
// read plus bytes written, timed with events, median of `reps` after a warm-up copy.
double D2DCopyGBps(CudaPool& pool, size_t bytes, int reps, cudaStream_t stream) {
  std::byte *a = nullptr, *b = nullptr;
  Check(pool.Alloc(bytes, &a), "alloc");
  Check(pool.Alloc(bytes, &b), "alloc");
  Check(cudaMemsetAsync(a, 0x5a, bytes, stream), "memset");
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "event");
  Check(cudaEventCreate(&e1), "event");
  std::vector<double> gbps;
  for (int r = -1; r < reps; ++r) {
    Check(cudaEventRecord(e0, stream), "record");
    Check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream), "memcpy");
    Check(cudaEventRecord(e1, stream), "record");
    Check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    if (r >= 0) gbps.push_back(2.0 * static_cast<double>(bytes) / (ms / 1e3) / 1e9);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  pool.Free(a);
  pool.Free(b);
  return Median(gbps);
}

// The gather kernel alone, as the hit path of a large batch runs it: `rows` rows of `row_bytes`
// from random slots, offsets already on the device, `launches` batches back to back between two
// synchronisations. GB/s of row bytes read plus written (the 8 B offset per row not counted).
double GatherKernelGBps(CudaPool& pool, uint32_t row_bytes, size_t rows, int launches, int reps) {
  std::vector<uint64_t> offsets(rows);
  std::mt19937_64 rng(row_bytes + 7);
  const uint64_t slots = pool.pool_bytes() / row_bytes;
  for (auto& o : offsets) o = (rng() % slots) * row_bytes;
  std::byte *dst = nullptr, *device_offsets = nullptr;
  Check(pool.Alloc(rows * row_bytes, &dst), "alloc");
  Check(pool.Alloc(rows * sizeof(uint64_t), &device_offsets), "alloc");
  Check(pool.Write(device_offsets, reinterpret_cast<const std::byte*>(offsets.data()),
                   rows * sizeof(uint64_t)),
        "write offsets");
  const auto* off = reinterpret_cast<const uint64_t*>(device_offsets);
  std::vector<double> gbps;
  for (int r = -1; r < reps; ++r) {
    Check(pool.Synchronize(), "sync");
    const auto t0 = Clock::now();
    for (int l = 0; l < launches; ++l) {
      Check(pool.GatherRowsDevice(off, rows, row_bytes, dst), "gather");
    }
    Check(pool.Synchronize(), "sync");
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r >= 0) gbps.push_back(2.0 * static_cast<double>(rows * row_bytes) * launches / s / 1e9);
  }
  pool.Free(dst);
  pool.Free(device_offsets);
  return Median(gbps);
}

// The device's bf16 matrix ceiling: an n×n×n cuBLAS GEMM, bf16 operands and output, fp32
// accumulation, on random data (zeros run faster), median of `reps` timed products.
double GemmBf16Tflops(int n, int reps, cudaStream_t stream) {
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<__nv_bfloat16> host(elems);
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (auto& h : host) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    h = __float2bfloat16(static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2 - 1);
  }
  __nv_bfloat16 *a = nullptr, *b = nullptr, *c = nullptr;
  Check(cudaMalloc(&a, elems * sizeof(__nv_bfloat16)), "gemm alloc");
  Check(cudaMalloc(&b, elems * sizeof(__nv_bfloat16)), "gemm alloc");
  Check(cudaMalloc(&c, elems * sizeof(__nv_bfloat16)), "gemm alloc");
  Check(cudaMemcpy(a, host.data(), elems * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "a");
  Check(cudaMemcpy(b, host.data(), elems * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "b");
  cublasHandle_t handle;
  auto check_blas = [](cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS)
      Die(std::string(what) + ": cuBLAS status " + std::to_string(st));
  };
  check_blas(cublasCreate(&handle), "cublasCreate");
  check_blas(cublasSetStream(handle, stream), "cublasSetStream");
  const float one = 1, zero = 0;
  auto gemm = [&] {
    check_blas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b,
                            CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  };
  for (int i = 0; i < 3; ++i) gemm();
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "event");
  Check(cudaEventCreate(&e1), "event");
  std::vector<double> tflops;
  for (int r = 0; r < reps; ++r) {
    Check(cudaEventRecord(e0, stream), "record");
    gemm();
    Check(cudaEventRecord(e1, stream), "record");
    Check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    tflops.push_back(2.0 * n * static_cast<double>(n) * n / (ms / 1e3) / 1e12);
  }
  Check(cudaGetLastError(), "gemm");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return Median(tflops);
}

enum class Refill { kNone, kUnthrottled, kThrottled };

// Latency (µs) of a request's misses: `rows` critical copies of `row_bytes` (the miss path copies
// row by row), from the first submit to the last callback, one request every 200..500 µs, while
// refill runs as told. Throttled refill follows the Refiller (refill.h): one chunk in flight, none
// issued while a critical copy is pending, a token bucket of `refill_rate` B/s with a burst of two
// chunks, polled every 200 µs.
std::vector<double> CriticalLatency(CudaPool& pool, size_t rows, size_t row_bytes, int samples,
                                    Refill refill, size_t chunk, double refill_rate, bool batched) {
  std::atomic<bool> stop{false};
  std::vector<std::byte> refill_src(chunk, std::byte{2});
  std::thread refiller;
  if (refill != Refill::kNone) {
    refiller = std::thread([&] {
      std::mutex mu;
      std::condition_variable cv;
      int in_flight = 0;
      const uint64_t half = pool.pool_bytes() / 2;
      uint64_t rel = 0;
      double tokens = 2.0 * chunk;
      auto last = Clock::now();
      while (!stop.load()) {
        if (refill == Refill::kThrottled) {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return in_flight == 0; });
          lock.unlock();
          const auto now = Clock::now();
          tokens =
              std::min(2.0 * chunk,
                       tokens + std::chrono::duration<double>(now - last).count() * refill_rate);
          last = now;
          if (pool.critical_pending() || tokens < static_cast<double>(chunk)) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            continue;
          }
          tokens -= static_cast<double>(chunk);
        } else {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return in_flight < 4; });  // keep the stream full
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          ++in_flight;
        }
        pool.CopyToPool(CudaCopyClass::kBackground, refill_src.data(), half + rel, chunk,
                        [&](CudaResult r) {
                          Check(r, "refill copy");
                          std::lock_guard<std::mutex> lock(mu);
                          --in_flight;
                          cv.notify_all();
                        });
        rel = (rel + chunk) % (half - chunk);
      }
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_flight == 0; });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // refill under way
  }
  std::vector<std::byte> src(rows * row_bytes, std::byte{3});
  std::vector<double> us;
  std::mt19937_64 rng(5);
  for (int i = 0; i < samples; ++i) {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = rows;
    std::vector<uint64_t> offsets(rows);
    for (auto& o : offsets) o = (rng() % (pool.pool_bytes() / 2 / row_bytes)) * row_bytes;
    auto landed = [&](size_t n) {
      return [&, n](CudaResult r) {
        Check(r, "critical copy");
        std::lock_guard<std::mutex> lock(mu);
        left -= n;
        if (left == 0) cv.notify_all();
      };
    };
    const auto t0 = Clock::now();
    if (batched) {
      pool.CopyRowsToPool(CudaCopyClass::kCritical, src.data(), offsets.data(), rows,
                          static_cast<uint32_t>(row_bytes), landed(rows));
    } else {
      for (size_t k = 0; k < rows; ++k) {
        pool.CopyToPool(CudaCopyClass::kCritical, src.data() + k * row_bytes, offsets[k], row_bytes,
                        landed(1));
      }
    }
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return left == 0; });
    }
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    std::this_thread::sleep_for(std::chrono::microseconds(200 + rng() % 300));
  }
  stop = true;
  if (refiller.joinable()) refiller.join();
  return us;
}

int Main(int argc, char** argv) {
  std::string out_dir = "sim/costs";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--out" && i + 1 < argc) {
      out_dir = argv[++i];
    } else {
      Die("unknown argument '" + a + "' (known: --out DIR, --quick)");
    }
  }
  if (int rc = CudaToolExitCode(); rc != 0) return rc;
  CudaResult r = CudaResult::Ok();
  auto pool = CudaPool::Create({.pool_bytes = size_t{4} << 30}, &r);
  if (pool == nullptr) Die("cannot create the pool: " + r.message());
  std::printf("device %s\n", pool->name().c_str());
  std::vector<Row> rows;
  auto add = [&](std::string metric, double value, std::string unit, std::string note) {
    std::printf("%-40s %14.3f %-10s %s\n", metric.c_str(), value, unit.c_str(), note.c_str());
    std::fflush(stdout);
    rows.push_back({std::move(metric), value, std::move(unit), std::move(note)});
  };
  const int reps = quick ? 3 : 7;
  const size_t total = quick ? (size_t{1} << 30) : (size_t{4} << 30);

  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) v.push_back(RawPinnedH2D(*pool, 1 << 20, total, stream));
  const double h2d = Median(v);
  add("h2d_pinned_gbps", h2d, "GB/s", "cudaMemcpyAsync 1 MiB from pinned, median");
  {
    KernelLoad load(*pool);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v.clear();
    for (int i = 0; i < reps; ++i) v.push_back(RawPinnedH2D(*pool, 1 << 20, total, stream));
    add("h2d_pinned_with_kernels_gbps", Median(v), "GB/s",
        "same, while gather kernels (2 KiB rows) run on the compute stream");
  }
  v.clear();
  for (int i = 0; i < reps; ++i) v.push_back(StagedCopyGBps(*pool, 1 << 20, total / 4));
  add("h2d_staged_copy_gbps", Median(v), "GB/s",
      "CudaPool::CopyToPool 1 MiB background (host staging memcpy included), median");

  for (uint32_t rb : {256u, 2048u}) {
    for (size_t batch : {size_t{1024}, size_t{65536}}) {
      add("gather_rows_per_s_" + std::to_string(rb) + "B_batch" + std::to_string(batch),
          GatherRowsPerSecond(*pool, rb, batch, quick ? 10 : 50), "rows/s",
          "GatherRows, random slots, launch + sync included, median");
    }
  }

  // The device's ceilings (issue 9): what the gather and the model's GEMMs are measured against.
  const double d2d = D2DCopyGBps(*pool, size_t{1} << 30, reps, stream);
  add("d2d_copy_gbps", d2d, "GB/s",
      "cudaMemcpyAsync 1 GiB device to device, read + written, median");
  for (uint32_t rb : {256u, 2048u}) {
    const size_t gather_rows = (size_t{1} << 30) / rb;  // 1 GiB of rows a launch
    const double g = GatherKernelGBps(*pool, rb, gather_rows, 10, reps);
    add("gather_kernel_gbps_" + std::to_string(rb) + "B", g, "GB/s",
        "gather kernel alone, 1 GiB of random rows a launch, offsets on the device");
    add("gather_kernel_fraction_of_d2d_" + std::to_string(rb) + "B", g / d2d, "ratio",
        "target >= 0.5 (issue 9)");
  }
  add("gemm_bf16_tflops", GemmBf16Tflops(8192, quick ? 5 : 20, stream), "TFLOP/s",
      "cuBLAS 8192^3 bf16 in/out, fp32 accumulate, random data, median");

  const int samples = quick ? 200 : 1000;
  const double refill_rate = 0.5 * h2d * 1e9;  // refill gets half the link, as in the local profile
  std::map<std::string, double> p99;
  for (bool batched : {false, true}) {
    const std::string kind = batched ? "miss_rows_64x256B_batched_" : "miss_copies_64x256B_";
    for (auto [refill, label] :
         {std::pair{Refill::kNone, "alone"}, std::pair{Refill::kUnthrottled, "refill_unthrottled"},
          std::pair{Refill::kThrottled, "refill_throttled"}}) {
      std::vector<double> us =
          CriticalLatency(*pool, 64, 256, samples, refill, 1 << 20, refill_rate, batched);
      add(kind + "p50_us_" + label, Percentile(us, 0.5), "us",
          batched ? "one CopyRowsToPool of 64 rows of 256 B to random slots (one staged copy + "
                    "scatter kernel), submit to callback; refill in 1 MiB chunks"
                  : "64 critical CopyToPool of 256 B, first submit to last callback; refill in "
                    "1 MiB chunks");
      add(kind + "p99_us_" + label, Percentile(us, 0.99), "us", "");
      p99[kind + label] = Percentile(us, 0.99);
    }
  }
  // Refill may add at most one chunk's transfer time to a critical copy (issues 3 and 9).
  const double chunk_us = (1 << 20) / (h2d * 1e9) * 1e6;
  add("refill_chunk_transfer_us", chunk_us, "us", "1 MiB at h2d_pinned_gbps");
  for (const char* kind : {"miss_copies_64x256B_", "miss_rows_64x256B_batched_"}) {
    add(std::string(kind) + "refill_throttled_added_p99_us",
        p99[std::string(kind) + "refill_throttled"] - p99[std::string(kind) + "alone"], "us",
        "P99 with throttled refill minus alone; target <= refill_chunk_transfer_us");
  }

  const std::string path = out_dir + "/" + DeviceSlug(pool->name()) + ".csv";
  std::ofstream f(path);
  if (!f) Die("cannot write " + path);
  f << "# measured by hlem_cuda_costs (scripts/gpu-check.sh) on " << pool->name() << "\n";
  f << "metric,value,unit,note\n" << std::setprecision(10);
  for (const Row& row : rows) {
    f << row.metric << "," << row.value << "," << row.unit << ",\"" << row.note << "\"\n";
  }
  std::printf("wrote %s\n", path.c_str());
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace hlem::cuda

int main(int argc, char** argv) { return hlem::cuda::Main(argc, argv); }
