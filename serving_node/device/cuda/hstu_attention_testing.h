#pragma once
// One request's layer for the paged attention's checks (hstu_attention_*_test.cc, and
// hlem_cuda_attention on a GPU): fp32 pages holding `history` tokens behind a page table
// (shuffled, or in order), a few pages no token uses, the queries and the candidates' own K/V, all
// uniform in [-1, 1) from a seed (never zeros), in host memory. No dependencies beyond the standard
// library.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "serving_node/device/cuda/hstu_attention.h"

namespace hlem::cuda {

struct HostAttentionCase {
  HstuAttentionArgs args;  // host pointers into the vectors below
  std::vector<std::byte> pool;
  std::vector<uint64_t> pages;
  std::vector<float> q, cand_k, cand_v, out;

  HostAttentionCase(const HstuAttentionShape& shape, uint32_t page_tokens, uint32_t layers,
                    uint32_t layer, bool shuffled, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
    auto next = [&x] {  // xorshift64*: cheap enough for the 200 MB pools of the timing cases
      x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
      return static_cast<float>((x * 0x2545f4914f6cdd1dULL) >> 40) / (1 << 23) - 1.0f;
    };
    serving::KvGeometry g;
    g.layers = layers;
    g.kv_dim = shape.heads * std::max(shape.d_qk, shape.d_v) + 4 * (seed % 2);  // padded or not
    g.dtype_bytes = 4;
    g.page_tokens = page_tokens;
    g.page_bytes = uint64_t{page_tokens} * g.token_bytes();
    const uint64_t used = (shape.history() + page_tokens - 1) / page_tokens, count = used + 3;
    std::vector<uint64_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    if (shuffled) std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    for (uint64_t p = 0; p < used; ++p) pages.push_back(order[p] * g.page_bytes);
    pool.resize(count * g.page_bytes);
    float* f = reinterpret_cast<float*>(pool.data());
    for (size_t i = 0; i < pool.size() / sizeof(float); ++i) f[i] = next();
    auto fill = [&](std::vector<float>* v, uint64_t n) {
      v->resize(n);
      for (float& e : *v) e = next();
    };
    const uint64_t hq = shape.heads * shape.d_qk, hv = shape.heads * shape.d_v;
    fill(&q, uint64_t{shape.rows()} * hq);
    fill(&cand_k, uint64_t{shape.candidates} * hq);
    fill(&cand_v, uint64_t{shape.candidates} * hv);
    out.assign(uint64_t{shape.rows()} * hv, 0.0f);
    args = {shape,         g,         layer, pool.data(), pages.data(), q.data(), cand_k.data(),
            cand_v.data(), out.data()};
  }
  HostAttentionCase(const HostAttentionCase&) = delete;
  HostAttentionCase& operator=(const HostAttentionCase&) = delete;
};

// ‖got − want‖ / ‖want‖ (‖got − want‖ when want is all zeros); infinity when got holds a NaN or
// an infinity (an element the kernel never wrote, on a poisoned output).
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    norm += double{want[i]} * want[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The shapes every check runs: edges first (no history, no fresh tokens, one candidate, no
// candidates, rows not a multiple of the query tile, head dims that are not multiples of 32, the
// widest heads, key splits), then `random` drawn from `seed`.
inline std::vector<HstuAttentionShape> AttentionCheckShapes(int random, uint64_t seed) {
  std::vector<HstuAttentionShape> shapes = {
      {.heads = 1, .d_qk = 8, .d_v = 8, .attn_norm = 3, .cached = 0, .fresh = 0, .candidates = 1},
      {.heads = 2, .d_qk = 32, .d_v = 32, .attn_norm = 64, .fresh = 1, .candidates = 1},
      {.heads = 2, .d_qk = 32, .d_v = 48, .attn_norm = 64, .cached = 100, .candidates = 17},
      {.heads = 3,
       .d_qk = 40,
       .d_v = 24,
       .attn_norm = 10,
       .cached = 37,
       .fresh = 33,
       .candidates = 5},
      {.heads = 4,
       .d_qk = 128,
       .d_v = 128,
       .attn_norm = 64,
       .cached = 1000,
       .fresh = 10,
       .candidates = 100},
      {.heads = 1,
       .d_qk = 256,
       .d_v = 256,
       .attn_norm = 64,
       .cached = 70,
       .fresh = 50,
       .candidates = 3},
      {.heads = 2, .d_qk = 7, .d_v = 5, .attn_norm = 1, .cached = 5, .fresh = 300},
      {.heads = 1,
       .d_qk = 16,
       .d_v = 16,
       .attn_norm = 2,
       .cached = 2000,
       .fresh = 3,
       .candidates = 2},
  };
  std::mt19937_64 rng(seed);
  const uint32_t dims[] = {16, 32, 64, 96, 128};
  for (int i = 0; i < random; ++i) {
    HstuAttentionShape s{.heads = 1 + static_cast<uint32_t>(rng() % 4),
                         .d_qk = dims[rng() % 5],
                         .d_v = dims[rng() % 5],
                         .attn_norm = 1.0f + static_cast<float>(rng() % 100),
                         .cached = static_cast<uint32_t>(rng() % 2000),
                         .fresh = static_cast<uint32_t>(rng() % 3 == 0 ? 0 : rng() % 200),
                         .candidates = static_cast<uint32_t>(rng() % 120)};
    if (s.rows() == 0) s.candidates = 1;
    shapes.push_back(s);
  }
  return shapes;
}

}  // namespace hlem::cuda
