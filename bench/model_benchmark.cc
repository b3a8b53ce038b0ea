// The HSTU model's forwards on the cpu (libtorch, one thread), local profile shape (2 layers, D 64,
// 2 heads of 32, 64 candidates): the cached forward (new tokens over a cached prefix in KV pages)
// against the plain reference forward (full recompute), per history length and new-token count.
// docs/perf/node.md.

#include <benchmark/benchmark.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/rng.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/model/hstu_model.h"
#include "serving_node/service/node_stack.h"

namespace hlem::serving {
namespace {

constexpr uint32_t kCandidates = 64;
constexpr uint64_t kPageBytes = 256 << 10;

HstuConfig LocalProfile() {
  return {.layers = 2,
          .dim = 64,
          .heads = 2,
          .d_qk = 32,
          .d_v = 32,
          .head_hidden = 64,
          .targets = 1,
          .attn_norm = 64,
          .max_positions = 1024};
}

struct Fixture {
  explicit Fixture(uint32_t length) {
    SetComputeThreads(1);
    model = *HstuModel::CreateRandom(LocalProfile(), 1);
    layout =
        *KvPageLayout::Make({.layers = 2, .kv_dim = model->kv_dim(), .dtype_bytes = 4}, kPageBytes);
    Rng rng(3);
    history.resize(size_t{length} * 64);
    cand.resize(size_t{kCandidates} * 64);
    scores.resize(kCandidates);
    for (float& x : history) x = static_cast<float>(static_cast<double>(rng() % 2001) / 1000 - 1);
    for (float& x : cand) x = static_cast<float>(static_cast<double>(rng() % 2001) / 1000 - 1);
    const uint32_t pages = (length + layout.page_tokens - 1) / layout.page_tokens;
    pool.resize(size_t{pages} * kPageBytes);
    for (uint32_t p = 0; p < pages; ++p) offsets.push_back(uint64_t{p} * kPageBytes);
  }
  KvPagesView kv() { return {layout, pool.data(), offsets}; }
  std::unique_ptr<HstuModel> model;
  KvPageLayout layout;
  std::vector<float> history, cand, scores;
  std::vector<std::byte> pool;
  std::vector<uint64_t> offsets;
};

// Args: history length, new tokens.
void BM_ForwardCached(benchmark::State& state) {
  const auto length = static_cast<uint32_t>(state.range(0));
  const auto fresh = static_cast<uint32_t>(state.range(1));
  Fixture f(length);
  const uint32_t cached = length - fresh;
  const std::span<const float> h(f.history);
  if (cached > 0) {
    if (!f.model->ForwardCached(f.kv(), 0, h.first(size_t{cached} * 64), f.cand, f.scores).ok()) {
      state.SkipWithError("prefix forward failed");
    }
  }
  for (auto _ : state) {
    if (!f.model->ForwardCached(f.kv(), cached, h.subspan(size_t{cached} * 64), f.cand, f.scores)
             .ok()) {
      state.SkipWithError("forward failed");
    }
  }
}

// Also the model's achieved FLOP/s (ReferenceForwardFlops per forward) and the `local` profile's
// link by ARCHITECTURE §9's rule: FLOP/s ÷ 12.5 kFLOP/B.
void BM_ForwardReference(benchmark::State& state) {
  const auto length = static_cast<uint32_t>(state.range(0));
  Fixture f(length);
  for (auto _ : state) {
    if (!f.model->ForwardReference(f.history, f.cand, f.scores).ok()) {
      state.SkipWithError("forward failed");
    }
  }
  const double flops = ReferenceForwardFlops(LocalProfile(), length, kCandidates);
  state.counters["GFLOP"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["link_MB"] =
      benchmark::Counter(flops / 12.5e3 / 1e6, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_ForwardCached)
    ->ArgNames({"L", "new"})
    ->Args({64, 64})
    ->Args({64, 1})
    ->Args({256, 256})
    ->Args({256, 3})
    ->Args({256, 128})
    ->Args({512, 512})
    ->Args({512, 5})
    ->Args({512, 47})
    ->Args({512, 256})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ForwardReference)
    ->ArgName("L")
    ->Arg(64)
    ->Arg(256)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hlem::serving

int main(int argc, char** argv) {
  const std::string note = hlem::serving::TuneComputeProcess(argv);  // may re-exec
  benchmark::AddCustomContext("compute", note);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
