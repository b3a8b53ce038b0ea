#pragma once
// HSTU attention over paged history K/V (ARCHITECTURE §5, issue 9), one layer of one request:
//   A_i = Σ_j SiLU(q_i · k_j / √d_qk) / N · M_ij · v_j, per head,
// for the step's query rows: its `fresh` new history tokens (global positions cached .. cached +
// fresh - 1), then its candidates. Keys: the history tokens 0 .. cached + fresh - 1, read from the
// KV pages of the pool through the request's page table (token j in page j / page_tokens, slot
// j % page_tokens, KvGeometry::OffsetInPage), then each candidate's own K/V (never cached). Mask:
// new token i sees history keys j <= cached + i; a candidate sees all history and itself only.
// The new tokens' K/V must already be in their pages (ScatterKv), as the CPU runner writes them.
//
// Storage is fp32, as the CPU runner's pages (hstu_model.cc): a token's K vector is heads · d_qk
// floats (head h at h · d_qk), its V vector heads · d_v, each padded to kv_dim. The kernel tiles
// queries and keys through shared memory and accumulates A in registers: the score matrix is
// never materialised. HstuAttentionHost is the same function in plain C++ with double sums, the
// kernel's reference.
//
// No dependency beyond the CUDA runtime and the standard library (built on bare GPU hosts).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "serving_node/core/kv_geometry.h"

namespace hlem::cuda {

struct HstuAttentionShape {
  uint32_t heads = 0;
  uint32_t d_qk = 0;  // per head, at most kMaxHeadDim
  uint32_t d_v = 0;   // per head, at most kMaxHeadDim
  float attn_norm = 1;
  uint32_t cached = 0;      // history tokens whose K/V were in the pages before this step
  uint32_t fresh = 0;       // new history tokens (query rows 0 .. fresh - 1)
  uint32_t candidates = 0;  // query rows fresh .. fresh + candidates - 1

  HLEM_HOST_DEVICE uint32_t rows() const { return fresh + candidates; }
  HLEM_HOST_DEVICE uint32_t history() const { return cached + fresh; }
  // Score entries the mask lets through (each costs 2 · (d_qk + d_v) FLOPs per head).
  double UnmaskedPairs() const {
    const double c = cached, n = fresh;
    return n * c + n * (n + 1) / 2 + static_cast<double>(candidates) * (c + n + 1);
  }
};

inline constexpr uint32_t kMaxHeadDim = 256;

// Pointers are device addresses for the kernel, host addresses for the reference.
struct HstuAttentionArgs {
  HstuAttentionShape shape;
  serving::KvGeometry geometry;  // fp32 (dtype_bytes 4); kv_dim >= heads · max(d_qk, d_v)
  uint32_t layer = 0;
  const std::byte* pool = nullptr;
  const uint64_t* page_offsets = nullptr;  // ceil(history / page_tokens) pool offsets, in order
  const float* q = nullptr;                // [rows][heads · d_qk]
  const float* cand_k = nullptr;           // [candidates][heads · d_qk]
  const float* cand_v = nullptr;           // [candidates][heads · d_v]
  float* out = nullptr;                    // [rows][heads · d_v]
};

// An empty string when the arguments describe a computation the kernel supports; else why not.
inline const char* HstuAttentionArgsError(const HstuAttentionArgs& a) {
  const HstuAttentionShape& s = a.shape;
  if (s.heads == 0 || s.d_qk == 0 || s.d_v == 0) return "heads, d_qk and d_v must be positive";
  if (s.d_qk > kMaxHeadDim || s.d_v > kMaxHeadDim) return "d_qk and d_v must be at most 256";
  if (!(s.attn_norm > 0) || !std::isfinite(s.attn_norm)) return "attn_norm must be positive";
  if (a.geometry.dtype_bytes != 4) return "the pages must hold fp32 K/V";
  const uint32_t widest = s.heads * (s.d_qk > s.d_v ? s.d_qk : s.d_v);
  if (a.geometry.kv_dim < widest) return "kv_dim is narrower than heads x max(d_qk, d_v)";
  if (a.layer >= a.geometry.layers) return "layer past the geometry's layers";
  if (a.geometry.page_tokens == 0) return "page_tokens must be positive";
  return "";
}

// The reference: double sums, one query row and head at a time.
inline void HstuAttentionHost(const HstuAttentionArgs& a) {
  const HstuAttentionShape& s = a.shape;
  const serving::KvGeometry& g = a.geometry;
  const uint32_t hq = s.heads * s.d_qk, hv = s.heads * s.d_v, total = s.history();
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d_qk));
  auto silu = [](double x) { return x / (1 + std::exp(-x)); };
  auto history = [&](uint32_t j, serving::KvPart part) {
    const uint64_t at =
        a.page_offsets[j / g.page_tokens] + g.OffsetInPage(a.layer, part, j % g.page_tokens);
    return reinterpret_cast<const float*>(a.pool + at);
  };
  double acc[kMaxHeadDim];
  for (uint32_t i = 0; i < s.rows(); ++i) {
    const bool candidate = i >= s.fresh;
    const uint32_t limit = candidate ? total : s.cached + i + 1;
    for (uint32_t h = 0; h < s.heads; ++h) {
      const float* q = a.q + uint64_t{i} * hq + h * s.d_qk;
      for (uint32_t e = 0; e < s.d_v; ++e) acc[e] = 0;
      auto add = [&](const float* k, const float* v) {
        double dot = 0;
        for (uint32_t e = 0; e < s.d_qk; ++e) dot += double{q[e]} * k[e];
        const double w = silu(dot * scale) / s.attn_norm;
        for (uint32_t e = 0; e < s.d_v; ++e) acc[e] += w * v[e];
      };
      for (uint32_t j = 0; j < limit; ++j) {
        add(history(j, serving::KvPart::kKey) + h * s.d_qk,
            history(j, serving::KvPart::kValue) + h * s.d_v);
      }
      if (candidate) {
        const uint64_t r = i - s.fresh;
        add(a.cand_k + r * hq + h * s.d_qk, a.cand_v + r * hv + h * s.d_v);
      }
      float* out = a.out + uint64_t{i} * hv + h * s.d_v;
      for (uint32_t e = 0; e < s.d_v; ++e) out[e] = static_cast<float>(acc[e]);
    }
  }
}

// The arithmetic of a launch. kFp32: CUDA cores, fp32 throughout (hstu_attention_kernel.inc).
// kBf16: tensor cores (hstu_attention_mma.cu): Q, K, V and the scores rounded to bf16, products
// accumulated in fp32; for heads of d_qk = d_v = 64 or 128 (else the fp32 kernel runs).
enum class HstuAttentionMath { kFp32, kBf16 };

// Whether the bf16 kernel runs these arguments: d_qk = d_v of 64 or 128, and K/V vectors at
// 16-byte boundaries (pages at multiples of 16 bytes of a 16-byte aligned pool; the KV cache's
// pages are).
inline bool HstuAttentionBf16Supports(const HstuAttentionArgs& a) {
  const HstuAttentionShape& s = a.shape;
  return s.d_qk == s.d_v && (s.d_qk == 64 || s.d_qk == 128) && a.geometry.kv_dim % 4 == 0 &&
         a.geometry.page_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a.pool) % 16 == 0;
}

// Launches the kernel on `stream` (a cudaStream_t). Returns "" or the error (an argument error,
// or the CUDA call that failed and why). Asynchronous: synchronise the stream before reading out.
std::string LaunchHstuAttention(const HstuAttentionArgs& args, void* stream,
                                HstuAttentionMath math = HstuAttentionMath::kFp32);
// The bf16 kernel alone: an error, not the fp32 kernel, when it does not support the arguments.
std::string LaunchHstuAttentionBf16(const HstuAttentionArgs& args, void* stream);

}  // namespace hlem::cuda
