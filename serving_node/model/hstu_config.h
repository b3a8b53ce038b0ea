#pragma once
// The shape of an HSTU model (ARCHITECTURE §5). No torch here: the pipeline, the KV cache layout
// and the tests read it without pulling libtorch in.

#include <cstdint>

#include "absl/status/status.h"

namespace hlem::serving {

struct HstuConfig {
  uint32_t layers = 2;
  uint32_t dim = 64;  // D: row dimension of every feature table and of the model
  uint32_t heads = 2;
  uint32_t d_qk = 32;             // per head
  uint32_t d_v = 32;              // per head
  uint32_t head_hidden = 64;      // h of the scoring head
  uint32_t targets = 1;           // T scores per candidate
  float attn_norm = 64;           // N: S = SiLU(q·k / √d_qk) / N
  uint32_t max_positions = 4096;  // history tokens (and the candidates' position P) below this

  // Elements per token per layer of the K and of the V vectors in a KV page: K (heads · d_qk) and
  // V (heads · d_v) both padded to the larger, so one KvGeometry describes the cache.
  uint32_t kv_dim() const { return heads * (d_qk > d_v ? d_qk : d_v); }
  uint32_t uvqk_dim() const { return heads * (2 * d_v + 2 * d_qk); }

  // Weights of a model of this shape: what CreateRandom allocates and a weight file holds.
  uint64_t ParameterCount() const;
  // The most a config may ask for (8 GiB of fp32): beyond it Validate refuses the config before
  // any tensor is allocated, rather than the allocation failing inside libtorch.
  static constexpr uint64_t kMaxParameters = uint64_t{1} << 31;

  // INVALID_ARGUMENT naming the field for a zero dimension or a non-positive / non-finite N, and
  // for a model of more than kMaxParameters weights.
  absl::Status Validate() const;
};

// Floating-point operations of ForwardReference over `history` tokens and `candidates`: per layer
// the UVQK and output projections of all n = history + candidates tokens (2·n·D·uvqk_dim and
// 2·n·heads·d_v·D) and the attention products over the full n × n score matrix of every head
// (2·n²·heads·(d_qk + d_v): masked entries included, as the CPU computes them), plus the scoring
// head over the candidates (2·C·(D·h + h·T)). Element-wise work (norms, SiLU, masks) is left out.
// The `local` profile's link is the model's measured FLOP/s ÷ 12.5 kFLOP/B (ARCHITECTURE §9).
inline double ReferenceForwardFlops(const HstuConfig& c, uint64_t history, uint64_t candidates) {
  const double n = static_cast<double>(history + candidates), D = c.dim, H = c.heads;
  const double per_layer = 2 * n * D * c.uvqk_dim() + 2 * n * H * c.d_v * D +
                           2 * n * n * H * (static_cast<double>(c.d_qk) + c.d_v);
  const double head = 2.0 * static_cast<double>(candidates) *
                      (D * c.head_hidden + static_cast<double>(c.head_hidden) * c.targets);
  return c.layers * per_layer + head;
}

// The same count for ForwardCached: `fresh` new history tokens and `candidates` computed over a
// cached prefix of `cached` tokens: the projections of the n = fresh + candidates new tokens and
// their scores against every key they may see, computed as one n × (cached + n) block per head
// (masked entries included). The simulator's compute cost is built on it (sim/twin/cost_model.h).
inline double CachedForwardFlops(const HstuConfig& c, uint64_t cached, uint64_t fresh,
                                 uint64_t candidates) {
  const double n = static_cast<double>(fresh + candidates), D = c.dim, H = c.heads;
  const double keys = static_cast<double>(cached) + n;
  const double per_layer = 2 * n * D * c.uvqk_dim() + 2 * n * H * c.d_v * D +
                           2 * n * keys * H * (static_cast<double>(c.d_qk) + c.d_v);
  const double head = 2.0 * static_cast<double>(candidates) *
                      (D * c.head_hidden + static_cast<double>(c.head_hidden) * c.targets);
  return c.layers * per_layer + head;
}

}  // namespace hlem::serving
