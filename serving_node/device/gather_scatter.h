#pragma once
// The data movements a serving step makes inside the pool, as plain host code: the `cpu` device
// runs them, and the CUDA kernels (cuda/cuda_pool.cu) are checked against them byte for byte
// (cuda/cuda_check.cc). No dependencies beyond the standard library.
//
// Gather: EMB rows from their slots into one contiguous batch. Sum: the model's embedding input,
// each token's feature rows added where they lie (pool slots, or a buffer of rows not cached).
// Scatter: the K/V of a step's new tokens, from the model's token-major batch
// (KvGeometry::OffsetInBatch) into their page slots (KvGeometry::OffsetInPage).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "serving_node/core/kv_geometry.h"
#include "serving_node/core/row_sources.h"

namespace hlem::serving {

// dst[i * row_bytes, (i + 1) * row_bytes) = pool[offsets[i], offsets[i] + row_bytes).
// The rows are random reads: each row's first lines are prefetched kGatherAhead rows ahead so
// that their misses overlap (a row's own lines then stream).
inline constexpr size_t kGatherAhead = 8;
inline void GatherRowsHost(const std::byte* pool, const uint64_t* offsets, size_t rows,
                           uint32_t row_bytes, std::byte* dst) {
  for (size_t i = 0; i < rows; ++i) {
    if (i + kGatherAhead < rows) {
      const std::byte* ahead = pool + offsets[i + kGatherAhead];
      __builtin_prefetch(ahead);
      if (row_bytes > 64) __builtin_prefetch(ahead + 64);
    }
    std::memcpy(dst + i * row_bytes, pool + offsets[i], row_bytes);
  }
}

// dst[t·dim + d] = Σ_{f < per_token} row(sources[t·per_token + f])[d] for t < tokens, added in
// f order from 0.0f; a source is a byte offset into `pool`, or (kRowInBuffer) into `extra`. The
// next token's rows are prefetched while this one's are added.
inline void SumRowsHost(const std::byte* pool, const std::byte* extra, const uint64_t* sources,
                        size_t tokens, uint32_t per_token, uint32_t dim, float* dst) {
  auto row = [&](uint64_t source) {
    const std::byte* base = (source & kRowInBuffer) != 0 ? extra : pool;
    return reinterpret_cast<const float*>(base + (source & ~kRowInBuffer));
  };
  for (size_t t = 0; t < tokens; ++t) {
    if (t + 1 < tokens) {
      for (uint32_t f = 0; f < per_token; ++f) {
        __builtin_prefetch(row(sources[(t + 1) * per_token + f]));
      }
    }
    float* out = dst + t * dim;
    for (uint32_t d = 0; d < dim; ++d) out[d] = 0.0f;
    for (uint32_t f = 0; f < per_token; ++f) {
      const float* v = row(sources[t * per_token + f]);
      for (uint32_t d = 0; d < dim; ++d) out[d] += v[d];
    }
  }
}

// Token t of `src` goes to slot slots[t] of the page at pool byte offset page_offsets[t], every
// layer's K and V.
inline void ScatterKvHost(const KvGeometry& g, std::byte* pool, const uint64_t* page_offsets,
                          const uint32_t* slots, size_t tokens, const std::byte* src) {
  const uint64_t vb = g.vector_bytes();
  for (size_t t = 0; t < tokens; ++t) {
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (KvPart p : {KvPart::kKey, KvPart::kValue}) {
        std::memcpy(pool + page_offsets[t] + g.OffsetInPage(l, p, slots[t]),
                    src + g.OffsetInBatch(t, l, p), vb);
      }
    }
  }
}

}  // namespace hlem::serving
