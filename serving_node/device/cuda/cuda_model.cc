// The CUDA HSTU runner on a GPU (issue 9): first its scores against the libtorch runner's, read
// from HSTU fixtures (hlem_hstu_fixture writes them on the build machine), for every request of
// a fixture computed in full, over a cached prefix split at several points, from the cache alone,
// and all requests batched in one call, with the pages poisoned with NaN (a slot read before it
// was written fails); a bad step must be refused with the pages untouched. Then the time of one
// HSTU layer at the paper's shape (D = 512, 4 heads of 128, 100 candidates) for histories of 1K,
// 4K and 15K with 1 %, 10 % and 100 % new tokens, and a batch of 8 requests against 8 calls,
// against the device's measured fp32 GEMM rate. No test framework (it runs on bare GPU hosts
// through scripts/gpu-check.sh).
//
//   hlem_cuda_model [--quick] [--costs-out DIR] [FIXTURE ...]
// --costs-out DIR also writes the twin's step cost fitted for this device (FitTwinCosts) to
// DIR/<device>-model.csv.
// Exits 0 when every check passes, 1 when one fails, 77 without a device.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "serving_node/core/hstu_flat.h"
#include "serving_node/device/cuda/cuda_pool.h"
#include "serving_node/device/cuda/hstu_runner.h"

namespace hlem::cuda {
namespace {

using serving::HstuFixture;
using serving::HstuFlatShape;
using serving::HstuFlatWeights;
using serving::KvGeometry;

// Relative error allowed (issue 9): 1e-3 with fp32 storage and arithmetic; 1e-2 where attention
// runs on bf16 tensor cores.
double tolerance = 1e-3;
const char* math_name = "fp32";
int failures = 0;

void Die(const std::string& what) {
  std::fprintf(stderr, "hlem_cuda_model: %s\n", what.c_str());
  std::exit(1);
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}

// max |got − want| / max |want|; infinity when got holds a NaN or an infinity.
double MaxRelative(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::abs(double{got[i]} - want[i]));
    scale = std::max(scale, std::abs(double{want[i]}));
  }
  return scale > 0 ? diff / scale : diff;
}

// A device KV pool with a page table per request (shuffled over the pool), poisoned with NaN.
struct Pool {
  KvGeometry geometry;
  std::byte* base = nullptr;
  std::vector<std::vector<uint64_t>> tables;

  Pool(const HstuFlatShape& s, uint32_t page_tokens, const std::vector<uint64_t>& tokens,
       uint64_t seed) {
    geometry.layers = s.layers;
    geometry.kv_dim = s.kv_dim();
    geometry.dtype_bytes = 4;
    geometry.page_tokens = page_tokens;
    geometry.page_bytes = uint64_t{page_tokens} * geometry.token_bytes();
    uint64_t count = 2;  // two pages no request uses
    for (uint64_t t : tokens) count += std::max<uint64_t>(1, (t + page_tokens - 1) / page_tokens);
    std::vector<uint64_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    size_t next = 0;
    for (uint64_t t : tokens) {
      tables.emplace_back();
      for (uint64_t p = 0; p < std::max<uint64_t>(1, (t + page_tokens - 1) / page_tokens); ++p) {
        tables.back().push_back(order[next++] * geometry.page_bytes);
      }
    }
    Check(cudaMalloc(&base, count * geometry.page_bytes), "cudaMalloc (pool)");
    Poison();
  }
  ~Pool() { cudaFree(base); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  void Poison() {
    uint64_t bytes = 0;
    for (const auto& t : tables) bytes += t.size();
    bytes = (bytes + 2) * geometry.page_bytes;
    Check(cudaMemset(base, 0xff, bytes), "cudaMemset (poison)");  // all-ones floats are NaN
  }
  std::vector<uint8_t> Snapshot() const {
    uint64_t pages = 2;
    for (const auto& t : tables) pages += t.size();
    std::vector<uint8_t> host(pages * geometry.page_bytes);
    Check(cudaMemcpy(host.data(), base, host.size(), cudaMemcpyDeviceToHost), "snapshot");
    return host;
  }
};

CudaHstuStep Step(const Pool& pool, size_t request, uint32_t cached, uint32_t fresh,
                  const float* new_history, uint32_t candidates, const float* candidate_emb,
                  float* scores) {
  CudaHstuStep st;
  st.geometry = pool.geometry;
  st.pool = pool.base;
  st.page_offsets = pool.tables[request].data();
  st.pages = pool.tables[request].size();
  st.cached = cached;
  st.fresh = fresh;
  st.candidates = candidates;
  st.new_history_emb = new_history;
  st.candidate_emb = candidate_emb;
  st.scores = scores;
  return st;
}

void Report(const char* what, const std::string& fixture, size_t c, const std::string& detail,
            double err) {
  const bool ok = err <= tolerance;
  if (!ok) ++failures;
  std::printf("%-4s %-4s %-10s %s case %zu %s: max rel err %.2e\n", ok ? "ok" : "FAIL", math_name,
              what, fixture.c_str(), c, detail.c_str(), err);
}

void CheckRun(CudaHstuRunner& runner, const CudaHstuStep* steps, size_t n, const char* what) {
  if (std::string e = runner.Run(steps, n); !e.empty()) Die(std::string(what) + ": " + e);
}

// The runner's arithmetic: fp32 throughout; bf16 attention; bf16 attention and tf32 GEMMs.
struct Mode {
  const char* name;
  CudaHstuRunnerOptions options;
};
const Mode kModes[] = {
    {"fp32", {.attention = HstuAttentionMath::kFp32, .tf32_gemm = false}},
    {"bf16", {.attention = HstuAttentionMath::kBf16, .tf32_gemm = false}},
    {"tf32", {.attention = HstuAttentionMath::kBf16, .tf32_gemm = true}},
};

void CheckFixture(const std::string& path, const Mode& mode) {
  tolerance =
      mode.options.attention == HstuAttentionMath::kFp32 && !mode.options.tf32_gemm ? 1e-3 : 1e-2;
  math_name = mode.name;
  HstuFixture f;
  if (std::string e = serving::ReadHstuFixture(path, &f); !e.empty()) Die(path + ": " + e);
  const std::string name = path.substr(path.find_last_of('/') + 1);
  std::string error;
  auto runner = CudaHstuRunner::Create(f.weights, &error, mode.options);
  if (!runner) Die(error);
  const HstuFlatShape& s = f.weights.shape;
  std::printf("fixture %s: seed %llu, %u layers, D %u, %u heads (d_qk %u, d_v %u), %zu cases\n",
              name.c_str(), static_cast<unsigned long long>(f.seed), s.layers, s.dim, s.heads,
              s.d_qk, s.d_v, f.cases.size());
  std::vector<uint64_t> tokens;
  for (const auto& c : f.cases) tokens.push_back(c.history);
  Pool pool(s, 16, tokens, f.seed);
  for (size_t i = 0; i < f.cases.size(); ++i) {
    const serving::HstuFixtureCase& c = f.cases[i];
    std::vector<float> got(c.scores.size());
    auto step = [&](uint32_t cached, uint32_t fresh, std::vector<float>* out) {
      return Step(pool, i, cached, fresh, c.history_emb.data() + uint64_t{cached} * s.dim,
                  c.candidates, c.candidate_emb.data(), out->data());
    };
    CudaHstuStep full = step(0, c.history, &got);
    CheckRun(*runner, &full, 1, "full");
    Report("full", name, i, "history " + std::to_string(c.history), MaxRelative(got, c.scores));
    CudaHstuStep cached = step(c.history, 0, &got);  // every token's K/V now in the pages
    CheckRun(*runner, &cached, 1, "cached");
    Report("cached", name, i, "all " + std::to_string(c.history) + " tokens cached",
           MaxRelative(got, c.scores));
    for (uint32_t split : {1u, c.history / 2, c.history - 1}) {
      if (c.history < 2 || split == 0 || split >= c.history) continue;
      pool.Poison();
      std::vector<float> first(c.scores.size());
      CudaHstuStep prefix = step(0, split, &first);
      CheckRun(*runner, &prefix, 1, "prefix");
      CudaHstuStep rest = step(split, c.history - split, &got);
      CheckRun(*runner, &rest, 1, "split");
      Report("split", name, i,
             std::to_string(split) + " cached + " + std::to_string(c.history - split) + " new",
             MaxRelative(got, c.scores));
    }
  }
  // Every case in one call: first all new, then all from the cache.
  for (bool from_cache : {false, true}) {
    if (!from_cache) pool.Poison();
    std::vector<std::vector<float>> got;
    std::vector<CudaHstuStep> steps;
    for (size_t i = 0; i < f.cases.size(); ++i) {
      const serving::HstuFixtureCase& c = f.cases[i];
      got.emplace_back(c.scores.size());
      steps.push_back(Step(pool, i, from_cache ? c.history : 0, from_cache ? 0 : c.history,
                           c.history_emb.data(), c.candidates, c.candidate_emb.data(),
                           got.back().data()));
    }
    CheckRun(*runner, steps.data(), steps.size(), "batch");
    for (size_t i = 0; i < f.cases.size(); ++i) {
      Report(from_cache ? "batch-kv" : "batch", name, i, "of " + std::to_string(f.cases.size()),
             MaxRelative(got[i], f.cases[i].scores));
    }
  }
  // A batch whose second step does not fit its pages is refused before anything runs.
  const auto before = pool.Snapshot();
  std::vector<float> scratch(f.cases[0].scores.size() * 2);
  const auto& c0 = f.cases[0];
  CudaHstuStep bad[2] = {Step(pool, 0, 0, c0.history, c0.history_emb.data(), c0.candidates,
                              c0.candidate_emb.data(), scratch.data()),
                         Step(pool, 0, 0, c0.history, c0.history_emb.data(), c0.candidates,
                              c0.candidate_emb.data(), scratch.data())};
  bad[1].pages = 0;
  bad[1].fresh = 16 + 1;
  const std::string refused = runner->Run(bad, 2);
  const bool untouched = pool.Snapshot() == before;
  const bool ok = refused.rfind("step 1: kv pages", 0) == 0 && untouched;
  if (!ok) ++failures;
  std::printf("%-4s refuse     %s: \"%s\", pages %s\n", ok ? "ok" : "FAIL", name.c_str(),
              refused.c_str(), untouched ? "untouched" : "CHANGED");
}

// The paper's layer (D = 512, 4 heads of 128) with random weights.
HstuFlatWeights PaperWeights(uint32_t layers, uint32_t max_positions) {
  return serving::RandomHstuFlatWeights(serving::PaperHstuShape(layers, max_positions), 42);
}

template <typename Fn>
double MedianMs(int reps, Fn&& fn) {
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Median ms of a returning step (`cached` tokens in the pages, `fresh` new, 100 candidates), after
// a prefill that puts all `history` tokens' K/V in the pages with this runner and one warm-up.
double TimeStep(CudaHstuRunner& runner, const Pool& pool, const std::vector<float>& hist,
                const std::vector<float>& cand, std::vector<float>& scores, uint32_t history,
                uint32_t cached, uint32_t fresh, int reps) {
  const uint32_t dim = runner.shape().dim;
  CudaHstuStep prefill = Step(pool, 0, 0, history, hist.data(), 100, cand.data(), scores.data());
  CheckRun(runner, &prefill, 1, "prefill");
  CudaHstuStep st = Step(pool, 0, cached, fresh, hist.data() + uint64_t{cached} * dim, 100,
                         cand.data(), scores.data());
  CheckRun(runner, &st, 1, "warm-up");
  return MedianMs(reps, [&] { CheckRun(runner, &st, 1, "timed"); });
}

// cuBLAS SGEMM at 8192³, TFLOP/s: the fp32 rate the runner's projections run at.
double SgemmTflops() {
  const int n = 8192;
  float *a = nullptr, *b = nullptr, *c = nullptr;
  Check(cudaMalloc(&a, sizeof(float) * n * n), "cudaMalloc");
  Check(cudaMalloc(&b, sizeof(float) * n * n), "cudaMalloc");
  Check(cudaMalloc(&c, sizeof(float) * n * n), "cudaMalloc");
  Check(cudaMemset(a, 0, sizeof(float) * n * n), "cudaMemset");
  Check(cudaMemset(b, 0, sizeof(float) * n * n), "cudaMemset");
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) Die("cublasCreate");
  const float one = 1, zero = 0;
  auto gemm = [&] {
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
    Check(cudaDeviceSynchronize(), "sgemm");
  };
  gemm();
  const double ms = MedianMs(5, gemm);
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

// Useful FLOPs of one layer of a step: the projections of its new rows, the attention over the
// score entries the mask lets through, and the head.
double LayerFlops(const HstuFlatShape& s, uint64_t cached, uint64_t fresh, uint64_t cands) {
  const double n = static_cast<double>(fresh + cands), c = static_cast<double>(cached),
               f = static_cast<double>(fresh);
  const double pairs = f * c + f * (f + 1) / 2 + static_cast<double>(cands) * (c + f + 1);
  return 2 * n * s.dim * static_cast<double>(s.uvqk()) +
         2 * n * static_cast<double>(s.hv()) * s.dim +
         2 * pairs * s.heads * (static_cast<double>(s.d_qk) + s.d_v) +
         2.0 * static_cast<double>(cands) * (s.dim * s.head_hidden + s.head_hidden);
}

void TimeLayers(bool quick) {
  const int reps = quick ? 5 : 15;
  const double sgemm = SgemmTflops();
  std::printf(
      "\n== HSTU layer on the GPU: D 512, 4 heads x 128, fp32 storage, 100 candidates, median of "
      "%d ==\ncuBLAS SGEMM 8192^3: %.1f TFLOP/s (the fp32 ceiling used below)\n"
      "modes: fp32 = fp32 throughout; bf16 = bf16 attention; tf32 = bf16 attention + tf32 GEMMs\n",
      reps, sgemm);
  std::printf("%8s %6s %8s %8s", "history", "new", "cached", "fresh");
  for (const Mode& m : kModes) std::printf(" %7s ms %8s", m.name, "TFLOP/s");
  std::printf(" %9s\n", "fp32/fast");
  std::string error;
  std::vector<std::unique_ptr<CudaHstuRunner>> runners;
  for (const Mode& m : kModes) {
    runners.push_back(CudaHstuRunner::Create(PaperWeights(1, 16384), &error, m.options));
    if (!runners.back()) Die(error);
  }
  const HstuFlatShape s = runners[0]->shape();
  std::mt19937_64 rng(7);
  std::normal_distribution<float> d(0, 0.3f);
  auto rows = [&](uint64_t n) {
    std::vector<float> v(n * s.dim);
    for (float& x : v) x = d(rng);
    return v;
  };
  const std::vector<float> cand = rows(100);
  std::vector<float> scores(100);
  for (uint32_t history : {1024u, 4096u, 15000u}) {
    Pool pool(s, 16, {history}, history);
    const std::vector<float> hist = rows(history);
    for (double share : {1.0, 0.1, 0.01}) {
      const uint32_t fresh = std::max<uint32_t>(1, static_cast<uint32_t>(history * share + 0.5));
      const uint32_t cached = history - fresh;
      std::printf("%8u %5.0f%% %8u %8u", history, share * 100, cached, fresh);
      const double flops = LayerFlops(s, cached, fresh, 100);
      std::vector<double> ms;
      for (auto& r : runners) {
        // Every mode fills the pages with its own K/V first (the tf32 projections differ).
        ms.push_back(TimeStep(*r, pool, hist, cand, scores, history, cached, fresh, reps));
        std::printf(" %10.3f %8.2f", ms.back(), flops / (ms.back() * 1e-3) / 1e12);
      }
      std::printf(" %8.2fx\n", ms[0] / *std::min_element(ms.begin() + 1, ms.end()));
    }
  }
  // Batching: 8 returning users (4 096 history, 10 % new) in one call against 8 calls.
  const uint32_t n = 8, history = 4096, fresh = 410;
  Pool pool(s, 16, std::vector<uint64_t>(n, history), 99);
  const std::vector<float> hist = rows(history);
  std::vector<std::vector<float>> out(n, std::vector<float>(100));
  std::vector<CudaHstuStep> batch;
  for (uint32_t i = 0; i < n; ++i) {
    CudaHstuStep prefill = Step(pool, i, 0, history, hist.data(), 100, cand.data(), out[i].data());
    CheckRun(*runners[0], &prefill, 1, "prefill");
    batch.push_back(Step(pool, i, history - fresh, fresh,
                         hist.data() + uint64_t{history - fresh} * s.dim, 100, cand.data(),
                         out[i].data()));
  }
  for (size_t m = 0; m < runners.size(); ++m) {
    CudaHstuRunner& r = *runners[m];
    const double one_call = MedianMs(reps, [&] { CheckRun(r, batch.data(), n, "batch"); });
    const double calls = MedianMs(reps, [&] {
      for (uint32_t i = 0; i < n; ++i) CheckRun(r, &batch[i], 1, "calls");
    });
    std::printf("%s batch of %u (history %u, %u new): one call %.3f ms, %u calls %.3f ms (%.2fx)\n",
                kModes[m].name, n, history, fresh, one_call, n, calls, calls / one_call);
  }
}

// The digital twin's model-step cost for this device (sim/twin/cost_model.h): step_overhead +
// CachedForwardFlops ÷ flops_per_second, fitted to the paper's 3-layer model in one of the node's
// modes by least squares on relative error over histories of 1K, 4K and 15K with 1 %,
// 10 % and 100 % new tokens. CachedForwardFlops as serving_node/model/hstu_config.h counts it:
// every score entry of the n × (cached + n) block, masked ones included. Written to
// <out_dir>/<device>-model.csv when out_dir is set.
void FitTwinCosts(bool quick, const Mode& mode, const std::string& device,
                  const std::string& out_dir) {
  const int reps = quick ? 5 : 11;
  std::string error;
  auto runner = CudaHstuRunner::Create(PaperWeights(3, 16384), &error, mode.options);
  if (!runner) Die(error);
  const HstuFlatShape s = runner->shape();
  auto twin_flops = [&](double cached, double fresh, double cands) {
    const double n = fresh + cands, keys = cached + n;
    const double per_layer = 2 * n * s.dim * static_cast<double>(s.uvqk()) +
                             2 * n * static_cast<double>(s.hv()) * s.dim +
                             2 * n * keys * s.heads * (static_cast<double>(s.d_qk) + s.d_v);
    return s.layers * per_layer +
           2 * cands * (static_cast<double>(s.dim) * s.head_hidden + s.head_hidden * s.targets);
  };
  std::mt19937_64 rng(11);
  std::normal_distribution<float> d(0, 0.3f);
  std::vector<float> cand(100 * s.dim), scores(100);
  for (float& x : cand) x = d(rng);
  struct Point {
    uint32_t history, fresh;
    double flops, seconds;
  };
  std::vector<Point> points;
  for (uint32_t history : {1024u, 4096u, 15000u}) {
    Pool pool(s, 16, {history}, history + 1);
    std::vector<float> hist(uint64_t{history} * s.dim);
    for (float& x : hist) x = d(rng);
    for (double share : {1.0, 0.1, 0.01}) {
      const uint32_t fresh = std::max<uint32_t>(1, static_cast<uint32_t>(history * share + 0.5));
      const uint32_t cached = history - fresh;
      const double ms = TimeStep(*runner, pool, hist, cand, scores, history, cached, fresh, reps);
      points.push_back({history, fresh, twin_flops(cached, fresh, 100), ms * 1e-3});
    }
  }
  // Minimise Σ ((a + b·F − t) / t)²: weights 1/t², normal equations of a line.
  double sw = 0, swf = 0, swff = 0, swt = 0, swft = 0;
  for (const Point& p : points) {
    const double w = 1 / (p.seconds * p.seconds);
    sw += w, swf += w * p.flops, swff += w * p.flops * p.flops;
    swt += w * p.seconds, swft += w * p.flops * p.seconds;
  }
  const double det = sw * swff - swf * swf;
  const double a = (swt * swff - swf * swft) / det, b = (sw * swft - swf * swt) / det;
  std::printf("\n== the twin's step cost, 3-layer paper model, mode %s, median of %d ==\n",
              mode.name, reps);
  std::printf("%8s %8s %14s %10s %10s %8s\n", "history", "fresh", "twin FLOPs", "ms", "fit ms",
              "error");
  double worst = 0;
  for (const Point& p : points) {
    const double fit = a + b * p.flops, err = (fit - p.seconds) / p.seconds;
    worst = std::max(worst, std::abs(err));
    std::printf("%8u %8u %14.4g %10.3f %10.3f %7.1f%%\n", p.history, p.fresh, p.flops,
                p.seconds * 1e3, fit * 1e3, 100 * err);
  }
  std::printf("fit: step_overhead %.1f us, flops_per_second %.4g (largest error %.1f %%)\n",
              a * 1e6, 1 / b, 100 * worst);
  if (out_dir.empty()) return;
  // One file, the modes' rows one after the other (the first mode truncates it).
  const std::string path = out_dir + "/" + DeviceSlug(device) + "-model.csv";
  const bool first = &mode == &kModes[1];
  std::FILE* f = std::fopen(path.c_str(), first ? "w" : "a");
  if (f == nullptr) Die("cannot write " + path);
  if (first) {
    std::fprintf(f, "# measured by hlem_cuda_model (scripts/gpu-check.sh) on %s\n", device.c_str());
    std::fprintf(f, "metric,value,unit,note\n");
  }
  const char* m = mode.name;
  std::fprintf(f, "%s_twin_step_overhead_us,%.6g,us,\"fit: 3-layer D 512 model, mode %s\"\n", m,
               a * 1e6, m);
  std::fprintf(f,
               "%s_twin_flops_per_second,%.6g,FLOP/s,\"fit: CachedForwardFlops (masked entries "
               "counted) per second\"\n",
               m, 1 / b);
  std::fprintf(f, "%s_twin_fit_largest_error,%.4g,ratio,\"over the points below\"\n", m, worst);
  for (const Point& p : points) {
    std::fprintf(f, "%s_step_ms_history%u_fresh%u,%.6g,ms,\"3 layers, 100 candidates, median\"\n",
                 m, p.history, p.fresh, p.seconds * 1e3);
  }
  std::fclose(f);
  std::printf("wrote %s\n", path.c_str());
}

int Main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "hlem_cuda_model: no CUDA device\n");
    return 77;
  }
  bool quick = false;
  std::string costs_out;
  std::vector<std::string> fixtures;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--costs-out" && i + 1 < argc) {
      costs_out = argv[++i];
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "hlem_cuda_model: unknown flag '%s' (known: --quick, --costs-out DIR)\n",
                   a.c_str());
      return 2;
    } else {
      fixtures.push_back(a);
    }
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("hlem_cuda_model on %s\n", prop.name);
  if (fixtures.empty()) std::printf("no fixtures given: the scores are not checked\n");
  for (const Mode& mode : kModes) {
    for (const std::string& f : fixtures) CheckFixture(f, mode);
  }
  TimeLayers(quick);
  // The node's modes (model.cuda_attention bf16, model.cuda_gemm fp32 or tf32).
  FitTwinCosts(quick, kModes[1], prop.name, costs_out);
  FitTwinCosts(quick, kModes[2], prop.name, costs_out);
  std::printf("hlem_cuda_model: %s\n",
              failures == 0 ? "all checks passed" : (std::to_string(failures) + " FAILED").c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace hlem::cuda

int main(int argc, char** argv) { return hlem::cuda::Main(argc, argv); }
