// The paged HSTU attention kernel on a GPU (issue 9): first its correctness against the host
// reference (hstu_attention.h) on fresh random inputs of many shapes, non-contiguous page tables
// and an output poisoned with NaN (an element left unwritten fails); then its time at the paper's
// shape (4 heads of d_qk = d_v = 128, fp32 pages, 100 candidates) for histories of 1K, 4K and 15K
// with 1 %, 10 % and 100 % new tokens, with the page table shuffled (paged) and in order
// (contiguous), against the device's copy and fp32 ceilings. No test framework (it runs on bare GPU
// hosts through scripts/gpu-check.sh).
//
//   hlem_cuda_attention [--quick]
// Prints one line per check and a table; exits 0 when every check passes, 1 when one fails, 77
// without a device.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "serving_node/device/cuda/cuda_pool.h"
#include "serving_node/device/cuda/hstu_attention.h"
#include "serving_node/device/cuda/hstu_attention_testing.h"

namespace hlem::cuda {
namespace {

using serving::KvGeometry;
using serving::KvPart;

void Die(const std::string& what) {
  std::fprintf(stderr, "hlem_cuda_attention: %s\n", what.c_str());
  std::exit(1);
}
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  T* d = nullptr;
  Check(cudaMalloc(&d, std::max<size_t>(1, host.size()) * sizeof(T)), "cudaMalloc");
  if (!host.empty()) {
    Check(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "copy");
  }
  return d;
}

// A HostAttentionCase with device copies of its inputs and an output poisoned with NaN.
struct Case {
  HostAttentionCase host;
  HstuAttentionArgs device;
  std::vector<void*> allocations;

  Case(const HstuAttentionShape& shape, uint32_t page_tokens, uint32_t layers, uint32_t layer,
       bool shuffled, uint64_t seed)
      : host(shape, page_tokens, layers, layer, shuffled, seed), device(host.args) {
    auto keep = [&](auto* p) {
      allocations.push_back(p);
      return p;
    };
    device.pool = keep(DeviceCopy(host.pool));
    device.page_offsets = keep(DeviceCopy(host.pages));
    device.q = keep(DeviceCopy(host.q));
    device.cand_k = keep(DeviceCopy(host.cand_k));
    device.cand_v = keep(DeviceCopy(host.cand_v));
    device.out = keep(DeviceCopy(std::vector<float>(host.out.size(), std::nanf(""))));
  }
  ~Case() {
    for (void* p : allocations) cudaFree(p);
  }
  Case(const Case&) = delete;
  Case& operator=(const Case&) = delete;
};

int failures = 0;

// The kernel against the host reference on fresh inputs; NaN (an unwritten element) fails.
// fp32: relative error at most 1e-4; bf16 (tensor cores): at most 1e-2.
void CheckCase(const HstuAttentionShape& shape, uint32_t page_tokens, bool shuffled, uint64_t seed,
               HstuAttentionMath math = HstuAttentionMath::kFp32) {
  Case c(shape, page_tokens, 3, seed % 3, shuffled, seed);
  const bool bf16 = math == HstuAttentionMath::kBf16;
  const std::string error =
      bf16 ? LaunchHstuAttentionBf16(c.device, nullptr) : LaunchHstuAttention(c.device, nullptr);
  if (!error.empty()) Die(error);
  Check(cudaDeviceSynchronize(), "attention kernel");
  std::vector<float> got(c.host.out.size());
  Check(cudaMemcpy(got.data(), c.device.out, got.size() * sizeof(float), cudaMemcpyDeviceToHost),
        "read out");
  HstuAttentionHost(c.host.args);
  const double rel = RelativeError(got, c.host.out);
  const bool ok = rel <= (bf16 ? 1e-2 : 1e-4);
  std::printf(
      "check %s heads %u d_qk %3u d_v %3u cached %5u fresh %4u cand %3u page %3u %-8s rel "
      "%.2e %s\n",
      bf16 ? "bf16" : "fp32", shape.heads, shape.d_qk, shape.d_v, shape.cached, shape.fresh,
      shape.candidates, page_tokens, shuffled ? "shuffled" : "in order", rel, ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  failures += ok ? 0 : 1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick") {
      quick = true;
    } else {
      Die(std::string("unknown argument '") + argv[i] + "' (known: --quick)");
    }
  }
  if (int rc = CudaToolExitCode(); rc != 0) return rc;

  // Correctness: the shapes of hstu_attention_testing.h, each with a shuffled page table of 16
  // tokens a page and with pages of 5 tokens in order.
  uint64_t seed = 1;
  std::vector<HstuAttentionShape> shapes = AttentionCheckShapes(quick ? 8 : 24, 2026);
  for (const HstuAttentionShape& s : shapes) {
    CheckCase(s, 16, true, seed++);
    CheckCase(s, 5, false, seed++);
  }
  // The bf16 tensor-core kernel: the shapes above it supports, and its own edges (no history, no
  // candidates, rows not a multiple of its 64-row tile, key splits, one candidate alone).
  const std::vector<HstuAttentionShape> bf16_edges = {
      {.heads = 2, .d_qk = 64, .d_v = 64, .attn_norm = 8, .cached = 0, .fresh = 300},
      {.heads = 1, .d_qk = 128, .d_v = 128, .attn_norm = 64, .cached = 70, .candidates = 1},
      {.heads = 3,
       .d_qk = 64,
       .d_v = 64,
       .attn_norm = 16,
       .cached = 33,
       .fresh = 65,
       .candidates = 7},
      {.heads = 4,
       .d_qk = 128,
       .d_v = 128,
       .attn_norm = 64,
       .cached = 5000,
       .fresh = 150,
       .candidates = 100},
      {.heads = 1, .d_qk = 64, .d_v = 64, .attn_norm = 2, .cached = 0, .fresh = 0, .candidates = 1},
      {.heads = 2,
       .d_qk = 128,
       .d_v = 128,
       .attn_norm = 32,
       .cached = 1,
       .fresh = 130,
       .candidates = 64}};
  shapes.insert(shapes.end(), bf16_edges.begin(), bf16_edges.end());
  for (const HstuAttentionShape& s : shapes) {
    if (s.d_qk != s.d_v || (s.d_qk != 64 && s.d_qk != 128)) continue;
    CheckCase(s, 16, true, seed++, HstuAttentionMath::kBf16);
    CheckCase(s, 5, false, seed++, HstuAttentionMath::kBf16);
  }
  // The argument checks.
  {
    HstuAttentionArgs bad{};
    bad.shape = {.heads = 1, .d_qk = 300, .d_v = 8, .attn_norm = 1, .candidates = 1};
    bad.geometry = {
        .layers = 1, .kv_dim = 300, .dtype_bytes = 4, .page_bytes = 2400, .page_tokens = 1};
    const bool refused = !LaunchHstuAttention(bad, nullptr).empty();
    bad.shape.d_qk = 8;
    bad.geometry.dtype_bytes = 2;
    const bool refused_bf16 = !LaunchHstuAttention(bad, nullptr).empty();
    std::printf("%-60s %s\n", "bad shapes are refused (d_qk 300, bf16 pages)",
                refused && refused_bf16 ? "PASS" : "FAIL");
    failures += refused && refused_bf16 ? 0 : 1;
  }
  std::printf("%s: %d failed\n", failures == 0 ? "ALL PASSED" : "FAILED", failures);

  // Timing at the paper's shape: one layer of one request, events around each launch.
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cudaEvent_t e0, e1;
  Check(cudaEventCreate(&e0), "event");
  Check(cudaEventCreate(&e1), "event");
  std::printf("\n%-8s %-6s %-10s %10s %10s %10s %10s %10s %8s\n", "history", "new", "pages",
              "fp32 us", "GB/s", "TFLOP/s", "bf16 us", "TFLOP/s", "speedup");
  for (uint32_t history : {1000u, 4000u, 15000u}) {
    for (double share : {0.01, 0.10, 1.0}) {
      for (bool shuffled : {true, false}) {
        const uint32_t fresh = static_cast<uint32_t>(history * share);
        const HstuAttentionShape s{.heads = 4,
                                   .d_qk = 128,
                                   .d_v = 128,
                                   .attn_norm = 64,
                                   .cached = history - fresh,
                                   .fresh = fresh,
                                   .candidates = 100};
        // 2 MiB pages hold 170 tokens of a 3-layer, 512-wide fp32 model.
        Case c(s, 170, 3, 1, shuffled, 99);
        auto time = [&](HstuAttentionMath math) {
          std::vector<double> us;
          for (int r = -2; r < (quick ? 5 : 15); ++r) {
            Check(cudaEventRecord(e0, stream), "record");
            const std::string error = LaunchHstuAttention(c.device, stream, math);
            if (!error.empty()) Die(error);
            Check(cudaEventRecord(e1, stream), "record");
            Check(cudaEventSynchronize(e1), "attention kernel");
            float ms = 0;
            Check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
            if (r >= 0) us.push_back(ms * 1e3);
          }
          return Median(us);
        };
        const double t = time(HstuAttentionMath::kFp32), t16 = time(HstuAttentionMath::kBf16);
        // The fewest bytes: the history's K and V of every head read once, the queries, the
        // candidates' K/V and the output once. FLOPs: the unmasked score entries' products.
        const double width = s.d_qk + s.d_v;
        const double bytes =
            4.0 * s.heads * width * (static_cast<double>(s.history()) + s.rows() + s.candidates);
        const double flops = s.UnmaskedPairs() * s.heads * 2.0 * width;
        std::printf("%-8u %-6u %-10s %10.1f %10.1f %10.2f %10.1f %10.2f %7.2fx\n", history, fresh,
                    shuffled ? "shuffled" : "in order", t, bytes / (t * 1e-6) / 1e9,
                    flops / (t * 1e-6) / 1e12, t16, flops / (t16 * 1e-6) / 1e12, t / t16);
      }
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace hlem::cuda

int main(int argc, char** argv) { return hlem::cuda::Main(argc, argv); }
