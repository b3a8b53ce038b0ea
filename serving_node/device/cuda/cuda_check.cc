// Self-check of the CUDA pool on a real GPU, against the host reference (gather_scatter.h): copies
// of every size class round-trip byte for byte, gather and scatter produce exactly what the cpu
// device produces, concurrent submitters and callbacks that submit more copies complete, and bad
// ranges are reported. No test framework (it runs on bare GPU hosts through scripts/gpu-check.sh);
// prints one line per check and exits 0 when all pass, 1 when one fails, 77 without a device.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "serving_node/device/cuda/cuda_pool.h"
#include "serving_node/device/gather_scatter.h"

namespace hlem::cuda {
namespace {

using serving::KvGeometry;

int failures = 0;

void Report(const char* check, bool ok, const std::string& detail = "") {
  std::printf("%-44s %s%s%s\n", check, ok ? "PASS" : "FAIL", detail.empty() ? "" : "  ",
              detail.c_str());
  std::fflush(stdout);
  failures += ok ? 0 : 1;
}

// Counts callbacks and waits for them (with a deadline: a hang is a failure, not a stuck run).
class Waiter {
 public:
  std::function<void(CudaResult)> Callback() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++expected_;
    }
    return [this](CudaResult r) {
      std::lock_guard<std::mutex> lock(mu_);
      ++done_;
      if (!r.ok()) errors_.push_back(r.message());
      cv_.notify_all();
    };
  }
  // A hang is a failure; the callbacks still pending may touch the caller's buffers, so the run
  // ends here rather than going on.
  void Wait(const char* check, std::chrono::seconds limit = std::chrono::seconds(60)) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, limit, [&] { return done_ == expected_; })) {
      std::printf("%-44s FAIL  %d of %d callbacks after %lld s: giving up\n", check, done_,
                  expected_, static_cast<long long>(limit.count()));
      std::exit(1);
    }
  }
  std::vector<std::string> errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int expected_ = 0;
  int done_ = 0;
  std::vector<std::string> errors_;
};

std::vector<std::byte> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

void CheckCopies(CudaPool& pool, std::vector<std::byte>& mirror) {
  // Sizes around the 1 MiB staging block, both classes, then one read of the whole pool.
  const size_t sizes[] = {1, 255, 4096, (1 << 20) - 1, 1 << 20, (1 << 20) + 7, 5 << 20};
  Waiter w;
  uint64_t off = 0;
  int k = 0;
  std::vector<std::vector<std::byte>> sources;
  for (size_t n : sizes) {
    for (CudaCopyClass cls : {CudaCopyClass::kCritical, CudaCopyClass::kBackground}) {
      sources.push_back(Random(n, ++k));
      pool.CopyToPool(cls, sources.back().data(), off, n, w.Callback());
      std::memcpy(mirror.data() + off, sources.back().data(), n);
      off += n + 3;  // unaligned starts
    }
  }
  w.Wait("copies of 1 B .. 5 MiB, both classes");
  std::vector<std::byte> back(pool.pool_bytes());
  CudaResult r = pool.ReadPool(0, back.data(), back.size());
  const bool same = r.ok() && std::memcmp(back.data(), mirror.data(), off) == 0;
  Report("copies of 1 B .. 5 MiB, both classes", w.errors().empty() && same,
         r.ok() ? (w.errors().empty() ? "" : w.errors()[0]) : r.message());
}

// Many small copies (a miss path copies row by row): the staging ring carves them contiguously.
void CheckSmallCopies(CudaPool& pool, std::vector<std::byte>& mirror) {
  constexpr size_t kRows = 20000, kRow = 256;
  const uint64_t base = 160 << 20;
  std::vector<std::byte> data = Random(kRows * kRow, 55);
  Waiter w;
  for (size_t i = 0; i < kRows; ++i) {
    pool.CopyToPool(CudaCopyClass::kCritical, data.data() + i * kRow, base + i * kRow, kRow,
                    w.Callback());
  }
  std::memcpy(mirror.data() + base, data.data(), data.size());
  w.Wait("20 000 critical copies of 256 B");
  std::vector<std::byte> back(data.size());
  CudaResult r = pool.ReadPool(base, back.data(), back.size());
  Report("20 000 critical copies of 256 B", w.errors().empty() && r.ok() && back == data);
}

// A request's misses in one CopyRowsToPool: rows to scattered, distinct slots, both classes,
// row sizes that do and do not allow 16-byte vectors, more rows than one staging piece holds.
void CheckRowCopies(CudaPool& pool, std::vector<std::byte>& mirror, const char* label) {
  Waiter w;
  std::mt19937_64 rng(77);
  std::vector<std::vector<std::byte>> sources;
  std::vector<std::vector<uint64_t>> offsets;
  int k = 0;
  for (uint32_t row_bytes : {7u, 256u, 2048u}) {
    // Distinct slots: a random start and a stride coprime to the slot count visit each once.
    const uint64_t slots = pool.pool_bytes() / row_bytes, rows = std::min<uint64_t>(slots, 5000);
    uint64_t stride = rng() % slots | 1;
    while (std::gcd(stride, slots) != 1) stride += 2;
    const uint64_t start = rng() % slots;
    offsets.emplace_back();
    for (uint64_t i = 0; i < rows; ++i) {
      offsets.back().push_back((start + i * stride) % slots * row_bytes);
    }
    sources.push_back(Random(rows * row_bytes, 900 + row_bytes));
    for (uint64_t i = 0; i < rows; ++i) {
      std::memcpy(mirror.data() + offsets.back()[i], sources.back().data() + i * row_bytes,
                  row_bytes);
    }
    pool.CopyRowsToPool(++k % 2 ? CudaCopyClass::kCritical : CudaCopyClass::kBackground,
                        sources.back().data(), offsets.back().data(), rows, row_bytes,
                        w.Callback());
  }
  w.Wait(label);
  std::vector<std::byte> back(pool.pool_bytes());
  CudaResult r = pool.ReadPool(0, back.data(), back.size());
  Report(label, w.errors().empty() && r.ok() && back == mirror,
         r.ok() ? (w.errors().empty() ? "" : w.errors()[0]) : r.message());
  // A row leaving the pool, and rows of 0 bytes, are errors and copy nothing.
  std::string leaves, empty;
  const uint64_t bad[] = {0, pool.pool_bytes() - 8};
  std::vector<std::byte> src(32, std::byte{1});
  pool.CopyRowsToPool(CudaCopyClass::kCritical, src.data(), bad, 2, 16,
                      [&](CudaResult e) { leaves = e.message(); });
  pool.CopyRowsToPool(CudaCopyClass::kCritical, src.data(), bad, 1, 0,
                      [&](CudaResult e) { empty = e.message(); });
  r = pool.ReadPool(0, back.data(), 16);
  Report("row copies leaving the pool are errors",
         !leaves.empty() && !empty.empty() && r.ok() &&
             std::memcmp(back.data(), mirror.data(), 16) == 0,
         leaves);
}

void CheckBadRanges(CudaPool& pool) {
  std::string error;
  std::vector<std::byte> src(16);
  pool.CopyToPool(CudaCopyClass::kCritical, src.data(), pool.pool_bytes() - 8, 16,
                  [&](CudaResult r) { error = r.message(); });
  std::byte x[16];
  CudaResult read = pool.ReadPool(pool.pool_bytes(), x, 1);
  Report("out-of-pool copy and read are errors", !error.empty() && !read.ok(), error);
}

// `threads` threads, each its own 8 MiB range, copies of `copy` bytes of alternating class.
void CheckConcurrentSubmitters(CudaPool& pool, std::vector<std::byte>& mirror, int threads,
                               size_t copy) {
  constexpr size_t kRange = 8 << 20;
  const uint64_t base = 64 << 20;
  const size_t per_thread = kRange / copy;
  Waiter w;
  std::vector<std::vector<std::byte>> data(threads);
  for (int t = 0; t < threads; ++t) {
    data[t] = Random(kRange, 100 + t);
    std::memcpy(mirror.data() + base + t * kRange, data[t].data(), kRange);
  }
  std::vector<std::function<void(CudaResult)>> callbacks;
  for (size_t i = 0; i < threads * per_thread; ++i) callbacks.push_back(w.Callback());
  const std::string label = std::to_string(threads) + " threads x " + std::to_string(per_thread) +
                            " copies of " + std::to_string(copy) + " B";
  std::vector<std::thread> pool_threads;
  for (int t = 0; t < threads; ++t) {
    pool_threads.emplace_back([&, t] {
      for (size_t i = 0; i < per_thread; ++i) {
        pool.CopyToPool(i % 2 == 0 ? CudaCopyClass::kCritical : CudaCopyClass::kBackground,
                        data[t].data() + i * copy, base + t * kRange + i * copy, copy,
                        callbacks[t * per_thread + i]);
      }
    });
  }
  for (auto& th : pool_threads) th.join();
  w.Wait(label.c_str());
  std::vector<std::byte> back(threads * kRange);
  CudaResult r = pool.ReadPool(base, back.data(), back.size());
  const bool same = r.ok() && std::memcmp(back.data(), mirror.data() + base, back.size()) == 0;
  Report(label.c_str(), w.errors().empty() && same);
}

// Chains of background copies, each link submitted from the previous one's callback, several
// chains at once (on a small ring they fill it): must not deadlock, and every link must succeed.
void CheckCallbackResubmits(CudaPool& pool, int chains, size_t link_bytes) {
  constexpr int kLinks = 64;
  std::vector<std::byte> src(link_bytes);
  std::mutex mu;
  std::condition_variable cv;
  int left = chains * kLinks;
  int failed = 0;
  std::vector<std::function<void(CudaResult)>> next(chains);
  for (int k = 0; k < chains; ++k) {
    next[k] = [&, k](CudaResult r) {
      bool again;
      {
        std::lock_guard<std::mutex> lock(mu);
        failed += r.ok() ? 0 : 1;
        again = --left >= chains;  // this chain's links are not all in yet
        cv.notify_all();           // under the lock: the waiter may return right after
      }
      if (again) {
        pool.CopyToPool(CudaCopyClass::kBackground, src.data(), k * link_bytes, link_bytes,
                        next[k]);
      }
    };
  }
  for (int k = 0; k < chains; ++k) {
    pool.CopyToPool(CudaCopyClass::kBackground, src.data(), k * link_bytes, link_bytes, next[k]);
  }
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return left <= 0; })) {
    std::printf("%-44s FAIL  %d links left after 60 s: giving up\n", "callbacks that submit copies",
                left);
    std::exit(1);
  }
  const std::string label = "callbacks that submit copies (" + std::to_string(chains) + " chains)";
  Report(label.c_str(), failed == 0);
}

void CheckGather(CudaPool& pool, const std::vector<std::byte>& mirror, const char* label) {
  std::mt19937_64 rng(7);
  bool all = true;
  std::string detail;
  for (uint32_t row_bytes : {4u, 13u, 256u, 2048u}) {
    for (size_t rows : {size_t{1}, size_t{1000}, size_t{3'000'000}}) {  // last: past the scratch
      if (rows * row_bytes > (512u << 20)) continue;
      std::vector<uint64_t> offsets(rows);
      for (auto& o : offsets) {
        o = rng() % (mirror.size() - row_bytes + 1);
        if (row_bytes % 16 == 0 && rng() % 2 == 0) o -= o % 16;  // aligned half the time
      }
      std::byte* dst = nullptr;
      CudaResult r = pool.Alloc(rows * row_bytes, &dst);
      if (r.ok()) r = pool.GatherRows(offsets.data(), rows, row_bytes, dst);
      if (r.ok()) r = pool.Synchronize();
      std::vector<std::byte> got(rows * row_bytes), want(rows * row_bytes);
      if (r.ok()) r = pool.Read(dst, got.data(), got.size());
      if (dst != nullptr) pool.Free(dst);
      serving::GatherRowsHost(mirror.data(), offsets.data(), rows, row_bytes, want.data());
      if (!r.ok() || got != want) {
        all = false;
        detail = std::to_string(rows) + " rows of " + std::to_string(row_bytes) +
                 " B: " + (r.ok() ? "bytes differ" : r.message());
      }
    }
  }
  Report(label, all, detail);
}

// Token sums against SumRowsHost, bit for bit. The rows are finite floats written over the
// pool's first 8 MiB (random bytes hold NaNs, whose payloads the host and the GPU propagate
// differently), plus a device buffer of rows that are not cached.
void CheckSums(CudaPool& pool, std::vector<std::byte>& mirror, const char* label) {
  std::mt19937_64 rng(13);
  auto finite = [&](size_t floats) {
    std::vector<float> v(floats);
    for (float& x : v) x = (static_cast<float>(rng() % 20001) - 10000.0f) / 4096.0f;
    return v;
  };
  constexpr size_t kPoolBytes = 8 << 20, kExtraBytes = 1 << 20;
  const std::vector<float> rows = finite(kPoolBytes / 4);
  std::memcpy(mirror.data(), rows.data(), kPoolBytes);
  Waiter w;
  pool.CopyToPool(CudaCopyClass::kCritical, mirror.data(), 0, kPoolBytes, w.Callback());
  w.Wait(label);
  const std::vector<float> extra_rows = finite(kExtraBytes / 4);
  std::byte* extra = nullptr;
  CudaResult r = pool.Alloc(kExtraBytes, &extra);
  if (r.ok())
    r = pool.Write(extra, reinterpret_cast<const std::byte*>(extra_rows.data()), kExtraBytes);
  bool all = w.errors().empty() && r.ok();
  std::string detail = r.ok() ? "" : r.message();
  struct Case {
    uint32_t dim, per_token;
    size_t tokens;
  };
  // The last case has more sources than one scratch batch holds.
  for (const Case& c :
       {Case{512, 2, 1}, Case{512, 3, 1000}, Case{512, 2, 20000}, Case{4, 2, 1'100'000}}) {
    if (!r.ok()) break;
    const uint64_t row_bytes = uint64_t{c.dim} * 4;
    std::vector<uint64_t> sources(c.tokens * c.per_token);
    for (uint64_t& src : sources) {
      src = rng() % 5 == 0 ? serving::RowInBuffer(rng() % (kExtraBytes / row_bytes) * row_bytes)
                           : rng() % (kPoolBytes / row_bytes) * row_bytes;
    }
    const size_t out_bytes = c.tokens * row_bytes;
    std::byte* dst = nullptr;
    CudaResult k = pool.Alloc(out_bytes, &dst);
    if (k.ok()) {
      k = pool.SumRows(sources.data(), c.tokens, c.per_token, c.dim, extra,
                       reinterpret_cast<float*>(dst));
    }
    if (k.ok()) k = pool.Synchronize();
    std::vector<std::byte> got(out_bytes), want(out_bytes);
    if (k.ok()) k = pool.Read(dst, got.data(), got.size());
    if (dst != nullptr) pool.Free(dst);
    serving::SumRowsHost(mirror.data(), reinterpret_cast<const std::byte*>(extra_rows.data()),
                         sources.data(), c.tokens, c.per_token, c.dim,
                         reinterpret_cast<float*>(want.data()));
    if (!k.ok() || got != want) {
      all = false;
      detail = std::to_string(c.tokens) + " tokens of " + std::to_string(c.per_token) + " × " +
               std::to_string(c.dim) + ": " + (k.ok() ? "sums differ" : k.message());
    }
  }
  if (extra != nullptr) pool.Free(extra);
  Report(label, all, detail);
}

void CheckScatter(CudaPool& pool, std::vector<std::byte>& mirror, const char* label) {
  bool all = true;
  std::string detail;
  std::mt19937_64 rng(11);
  for (auto [kv_dim, dtype] : {std::pair{64u, 2u}, std::pair{64u, 4u}, std::pair{5u, 2u}}) {
    KvGeometry g{.layers = 3, .kv_dim = kv_dim, .dtype_bytes = dtype, .page_bytes = 64 << 10};
    g.page_tokens = static_cast<uint32_t>(g.page_bytes / g.token_bytes());
    // Distinct (page, slot) targets over the first 256 pages of the pool.
    const size_t tokens = 5000;
    std::vector<uint64_t> all_targets;
    for (uint64_t p = 0; p < 256; ++p) {
      for (uint32_t s = 0; s < g.page_tokens; ++s) all_targets.push_back(p << 32 | s);
    }
    std::shuffle(all_targets.begin(), all_targets.end(), rng);
    std::vector<uint64_t> page_offsets(tokens);
    std::vector<uint32_t> slots(tokens);
    for (size_t t = 0; t < tokens; ++t) {
      page_offsets[t] = (all_targets[t] >> 32) * g.page_bytes;
      slots[t] = static_cast<uint32_t>(all_targets[t] & 0xffffffff);
    }
    std::vector<std::byte> batch = Random(tokens * g.token_bytes(), dtype);
    std::byte* src = nullptr;
    CudaResult r = pool.Alloc(batch.size(), &src);
    if (r.ok()) r = pool.Write(src, batch.data(), batch.size());
    if (r.ok()) r = pool.ScatterKv(g, page_offsets.data(), slots.data(), tokens, src);
    if (r.ok()) r = pool.Synchronize();
    if (src != nullptr) pool.Free(src);
    serving::ScatterKvHost(g, mirror.data(), page_offsets.data(), slots.data(), tokens,
                           batch.data());
    std::vector<std::byte> back(pool.pool_bytes());
    if (r.ok()) r = pool.ReadPool(0, back.data(), back.size());
    if (!r.ok() || back != mirror) {
      all = false;
      detail = "kv_dim " + std::to_string(kv_dim) + " dtype " + std::to_string(dtype) + ": " +
               (r.ok() ? "bytes differ" : r.message());
    }
  }
  Report(label, all, detail);
}

// A pool filled with known bytes; the host mirror is what it must hold after every check.
std::unique_ptr<CudaPool> MakePool(const CudaPoolOptions& options, std::vector<std::byte>* mirror) {
  CudaResult r = CudaResult::Ok();
  auto pool = CudaPool::Create(options, &r);
  if (pool == nullptr) {
    std::printf("FAIL: cannot create the pool: %s\n", r.message().c_str());
    std::exit(1);
  }
  *mirror = Random(pool->pool_bytes(), options.pool_bytes);
  Waiter w;
  pool->CopyToPool(CudaCopyClass::kBackground, mirror->data(), 0, mirror->size(), w.Callback());
  w.Wait("fill the pool");
  Report("fill the pool", w.errors().empty());
  return pool;
}

int Main() {
  if (int rc = CudaToolExitCode(); rc != 0) return rc;
  std::vector<std::byte> mirror;
  {
    auto pool = MakePool({.pool_bytes = 256 << 20}, &mirror);
    std::printf("device %s, pool %llu MiB (default staging and scratch)\n", pool->name().c_str(),
                static_cast<unsigned long long>(pool->pool_bytes() >> 20));
    CheckCopies(*pool, mirror);
    CheckSmallCopies(*pool, mirror);
    CheckBadRanges(*pool);
    CheckConcurrentSubmitters(*pool, mirror, 4, 64 << 10);
    CheckGather(*pool, mirror, "gather == host reference (4 .. 2048 B rows)");
    CheckSums(*pool, mirror, "token sums == host reference, bit for bit");
    CheckScatter(*pool, mirror, "scatter == host reference (5000 tokens)");
    CheckRowCopies(*pool, mirror, "row copies to scattered slots == reference");
    CheckCallbackResubmits(*pool, 1, 1 << 20);
  }
  {
    // Tiny staging and scratch: every copy wraps the ring, every kernel crosses index batches.
    auto pool = MakePool({.pool_bytes = 192 << 20,
                          .staging_bytes_per_class = 48 << 10,
                          .max_piece_bytes = 16 << 10,
                          .kernel_scratch_bytes = 4096},
                         &mirror);
    std::printf("pool %llu MiB, 48 KiB staging rings, 4 KiB kernel scratch\n",
                static_cast<unsigned long long>(pool->pool_bytes() >> 20));
    CheckCopies(*pool, mirror);
    // More submitters than cores, row-sized copies: ring order must stay queue order.
    CheckConcurrentSubmitters(*pool, mirror, 12, 1 << 10);
    CheckConcurrentSubmitters(*pool, mirror, 4, 12 << 10);
    CheckGather(*pool, mirror, "gather, small scratch");
    CheckSums(*pool, mirror, "token sums, small scratch");
    CheckScatter(*pool, mirror, "scatter, small scratch");
    CheckRowCopies(*pool, mirror, "row copies, small staging pieces");
    CheckCallbackResubmits(*pool, 6, 16 << 10);  // 6 pieces of 16 KiB in flight: a full ring
  }
  std::printf("%s: %d failed\n", failures == 0 ? "ALL PASSED" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace hlem::cuda

int main() { return hlem::cuda::Main(); }
