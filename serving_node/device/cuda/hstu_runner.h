#pragma once
// The HSTU model on a GPU (ARCHITECTURE §5, issue 9): the libtorch runner's ForwardBatch with our
// kernels and cuBLAS, fp32 storage and fp32 accumulation. A batch of requests of different
// lengths runs as one launch sequence per layer: the per-token work (inputs, LayerNorms, the UVQK
// projection with its bias and SiLU, U ⊙ LN(A), the output projection with the residual, the
// head) over all the batch's tokens at once; the paged attention kernel (hstu_attention.h) per
// request over its own pages. The new history tokens' K/V are written straight into the
// request's pages in the pool (device memory), laid out as the CPU runner lays them out.
//
// Not thread-safe: one runner per stream. No dependency beyond the CUDA runtime, cuBLAS and the
// standard library (it builds on bare GPU hosts).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "serving_node/core/hstu_flat.h"
#include "serving_node/core/kv_geometry.h"
#include "serving_node/device/cuda/hstu_attention.h"

namespace hlem::cuda {

// One request. Host pointers except `pool` (and the embeddings when emb_on_device).
struct CudaHstuStep {
  serving::KvGeometry geometry;            // fp32, layers and kv_dim as the model's
  std::byte* pool = nullptr;               // device address of the KV pool
  const uint64_t* page_offsets = nullptr;  // the user's block table (pool byte offsets)
  uint64_t pages = 0;
  uint32_t cached = 0;  // history tokens whose K/V are in the pages already
  uint32_t fresh = 0;   // new history tokens, computed and appended to the pages
  uint32_t candidates = 0;
  const float* new_history_emb = nullptr;  // fresh × D (summed feature rows)
  const float* candidate_emb = nullptr;    // candidates × D
  // The two embedding inputs are device addresses (the node sums them on the device:
  // serving::Device::SumRows) rather than host ones: copied device to device, not uploaded.
  bool emb_on_device = false;
  float* scores = nullptr;  // candidates × T, written
};

struct CudaHstuRunnerOptions {
  // The attention kernel's arithmetic (hstu_attention.h): fp32, or bf16 tensor cores where the
  // heads allow (d_qk = d_v of 64 or 128; else fp32).
  HstuAttentionMath attention = HstuAttentionMath::kFp32;
  // The projections' GEMMs: fp32 (cuBLAS SGEMM on CUDA cores) or tf32 tensor cores (fp32 in and
  // out, products of 10-bit mantissas, fp32 accumulation).
  bool tf32_gemm = false;
};

class CudaHstuRunner {
 public:
  // Uploads the weights to the current device. nullptr and *error set for invalid weights or a
  // CUDA / cuBLAS failure.
  static std::unique_ptr<CudaHstuRunner> Create(const serving::HstuFlatWeights& weights,
                                                std::string* error,
                                                const CudaHstuRunnerOptions& options = {});
  ~CudaHstuRunner();
  CudaHstuRunner(const CudaHstuRunner&) = delete;
  CudaHstuRunner& operator=(const CudaHstuRunner&) = delete;

  const serving::HstuFlatShape& shape() const { return shape_; }

  // Runs every step and returns when their scores are on the host: "" or the error. Every step
  // is checked before any work ("step i: ..."), so a bad step leaves the pages untouched.
  std::string Run(const CudaHstuStep* steps, size_t count);

 private:
  struct Impl;
  CudaHstuRunner(const serving::HstuFlatShape& shape, const CudaHstuRunnerOptions& options,
                 std::unique_ptr<Impl> impl);
  const serving::HstuFlatShape shape_;
  const CudaHstuRunnerOptions options_;
  std::unique_ptr<Impl> impl_;
};

// "" when `step` is one a model of `shape` can run; else why not (the libtorch runner's checks).
inline std::string CudaHstuStepError(const serving::HstuFlatShape& shape, const CudaHstuStep& s) {
  const serving::KvGeometry& g = s.geometry;
  if (s.candidates == 0) return "candidates: none";
  if (s.candidates > serving::kHstuFixtureMaxCandidates) return "candidates: more than 65536";
  const uint64_t total = uint64_t{s.cached} + s.fresh;
  if (total > shape.max_positions) {
    return "history of " + std::to_string(total) + " tokens exceeds max_positions " +
           std::to_string(shape.max_positions);
  }
  if (g.layers != shape.layers || g.kv_dim != shape.kv_dim() || g.dtype_bytes != 4 ||
      g.page_tokens == 0 || g.page_bytes < uint64_t{g.page_tokens} * g.token_bytes()) {
    return "kv pages: geometry (layers " + std::to_string(g.layers) + ", kv_dim " +
           std::to_string(g.kv_dim) + ", dtype " + std::to_string(g.dtype_bytes) +
           ") does not match the model (layers " + std::to_string(shape.layers) + ", kv_dim " +
           std::to_string(shape.kv_dim()) + ", fp32)";
  }
  if (s.pages * g.page_tokens < total || s.pool == nullptr ||
      (s.pages > 0 && s.page_offsets == nullptr)) {
    return "kv pages: " + std::to_string(s.pages) + " pages cannot hold " + std::to_string(total) +
           " tokens";
  }
  if ((s.fresh > 0 && s.new_history_emb == nullptr) || s.candidate_emb == nullptr ||
      s.scores == nullptr) {
    return "a non-empty input or the scores has no buffer";
  }
  return "";
}

}  // namespace hlem::cuda
