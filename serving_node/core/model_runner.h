#pragma once
// What the node pipeline asks of the model (ARCHITECTURE §5), without torch: a batch of steps,
// one per request, each reusing its user's cached K/V from pages, computing its new history
// tokens and candidates, appending the new tokens' K/V and scoring the candidates. The HSTU
// runner on libtorch (serving_node/model) implements it; a CUDA runner (our kernels + cuBLAS) can
// be added behind the same interface.

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "serving_node/core/kv_geometry.h"

namespace hlem::serving {

// A user's K/V for one forward: token j lives in the page at pool byte offset
// page_offsets[j / page_tokens], slot j % page_tokens (the user's block table in token order),
// laid out as `geometry` says.
struct KvPagesView {
  KvGeometry geometry;
  std::byte* pool = nullptr;  // the pool as the runner addresses it (the cpu device's arena)
  std::span<const uint64_t> page_offsets;
};

// One request of a batch. Embeddings are the per-token sums of the feature rows, dim floats each,
// in the device's memory as the runner addresses it (Device::SumRows' output: host memory on the
// cpu device, device memory on `cuda`), like the pool.
struct ModelStep {
  KvPagesView kv;
  uint64_t cached_len = 0;                 // tokens [0, cached_len) have K/V in kv
  std::span<const float> new_history_emb;  // tokens [cached_len, cached_len + n): n × dim
  std::span<const float> candidate_emb;    // C × dim
  std::span<float> scores;                 // C × targets, written
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual uint32_t dim() const = 0;
  virtual uint32_t targets() const = 0;
  virtual uint32_t layers() const = 0;
  virtual uint32_t kv_dim() const = 0;         // elements of a K or V vector in a page
  virtual uint32_t max_positions() const = 0;  // history tokens must stay below this
  // Runs every step; a step's new K/V land in its pages. The steps' pages must not overlap.
  // INVALID_ARGUMENT / OUT_OF_RANGE naming the step for a bad step (then nothing is written for
  // the batch: steps are checked before any compute).
  virtual absl::Status Run(std::span<const ModelStep> steps) = 0;
};

}  // namespace hlem::serving
