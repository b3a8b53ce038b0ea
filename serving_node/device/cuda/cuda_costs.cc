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

std::string Slug(const std::string& name) {
  // "cuda:0 NVIDIA H200" -> "nvidia-h200"
  std::string s = name.substr(name.find(' ') == std::string::npos ? 0 : name.find(' ') + 1);
  std::string out;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "gpu" : out;
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

enum class Refill { kNone, kUnthrottled, kThrottled };

// Latency (µs) of a request's misses: `rows` critical copies of `row_bytes` (the miss path copies
// row by row), from the first submit to the last callback, one request every 200..500 µs, while
// refill runs as told. Throttled refill follows the Refiller (refill.h): one chunk in flight, none
// issued while a critical copy is pending, a token bucket of `refill_rate` B/s with a burst of two
// chunks, polled every 200 µs.
std::vector<double> CriticalLatency(CudaPool& pool, size_t rows, size_t row_bytes, int samples,
                                    Refill refill, size_t chunk, double refill_rate) {
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
    const auto t0 = Clock::now();
    for (size_t k = 0; k < rows; ++k) {
      pool.CopyToPool(CudaCopyClass::kCritical, src.data() + k * row_bytes,
                      (rng() % (pool.pool_bytes() / 2 / row_bytes)) * row_bytes, row_bytes,
                      [&](CudaResult r) {
                        Check(r, "critical copy");
                        std::lock_guard<std::mutex> lock(mu);
                        if (--left == 0) cv.notify_all();
                      });
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

  const int samples = quick ? 200 : 1000;
  const double refill_rate = 0.5 * h2d * 1e9;  // refill gets half the link, as in the local profile
  for (auto [refill, label] :
       {std::pair{Refill::kNone, "alone"}, std::pair{Refill::kUnthrottled, "refill_unthrottled"},
        std::pair{Refill::kThrottled, "refill_throttled"}}) {
    std::vector<double> us = CriticalLatency(*pool, 64, 256, samples, refill, 1 << 20, refill_rate);
    add(std::string("miss_copies_64x256B_p50_us_") + label, Percentile(us, 0.5), "us",
        "64 critical copies of 256 B, first submit to last callback; refill in 1 MiB chunks");
    add(std::string("miss_copies_64x256B_p99_us_") + label, Percentile(us, 0.99), "us", "");
  }

  const std::string path = out_dir + "/" + Slug(pool->name()) + ".csv";
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
