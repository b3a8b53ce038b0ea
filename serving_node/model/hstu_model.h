#pragma once
// HSTU with exact cross-request KV reuse (ARCHITECTURE §5), on libtorch's CPU backend. The only
// part of the serving node that includes torch (in hstu_model.cc, behind this torch-free header).
//
// Inputs are the feature rows already summed per token: e[t] = Σ_f E_f[id_f(t)] (the pipeline
// gathers them from the EMB cache); the model forms x = √D · e + P[pos] with pos = j for history
// token j and pos = H (the history length) for every candidate.
//
// Two forwards: ForwardReference recomputes everything (the correctness reference), and
// ForwardCached reuses the K/V of the cached history prefix from KV pages, computes only the new
// history tokens and the candidates, and writes the new tokens' K/V into their pages. The two
// give the same scores within float tolerance for any split of the history (tested).
//
// HstuModel is the ModelRunner the node pipeline uses on the cpu device. Thread-safe for
// concurrent forwards (the weights are read-only).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "serving_node/core/hstu_flat.h"
#include "serving_node/core/kv_geometry.h"
#include "serving_node/core/model_runner.h"
#include "serving_node/model/hstu_config.h"

namespace hlem::serving {

class HstuModel final : public ModelRunner {
 public:
  // Weights drawn from `seed` (deterministic): matrices N(0, 1/fan_in), LayerNorm gains near 1.
  static absl::StatusOr<std::unique_ptr<HstuModel>> CreateRandom(const HstuConfig& config,
                                                                 uint64_t seed);
  // Weights from a state-dict file written by Python's torch.save(model.state_dict(), path) or
  // by Save; names and shapes in docs/model.md. NOT_FOUND for a missing or unreadable file;
  // INVALID_ARGUMENT naming the tensor for a missing or unexpected name, a shape that does not
  // match `config`, a tensor that is not floating point or holds NaN or infinite values, or a
  // file that is not a state dict.
  static absl::StatusOr<std::unique_ptr<HstuModel>> Load(const HstuConfig& config,
                                                         const std::string& path);
  // Writes the weights as a state dict (the format Load and Python's torch.load read).
  absl::Status Save(const std::string& path) const;
  // The weights as flat fp32 arrays (what the CUDA runner uploads and an HSTU fixture carries).
  HstuFlatWeights Flatten() const;
  ~HstuModel() override;
  HstuModel(const HstuModel&) = delete;
  HstuModel& operator=(const HstuModel&) = delete;

  const HstuConfig& config() const;

  // history_emb: H × D floats (row-major), candidate_emb: C × D, scores: C × T.
  absl::Status ForwardReference(std::span<const float> history_emb,
                                std::span<const float> candidate_emb,
                                std::span<float> scores) const;
  // Tokens [0, cached_len) have K/V in `kv`; new_history_emb holds tokens
  // [cached_len, cached_len + n) (n × D floats), whose K/V this call writes into `kv`.
  // INVALID_ARGUMENT for mismatched sizes, a geometry that does not match the model, too few
  // pages for cached_len + n tokens, or a history past max_positions.
  absl::Status ForwardCached(const KvPagesView& kv, uint64_t cached_len,
                             std::span<const float> new_history_emb,
                             std::span<const float> candidate_emb, std::span<float> scores) const;
  // ForwardCached for a batch of requests of different lengths in one pass: the per-token work
  // (LayerNorms, the UVQK and output projections, the head) runs as one matrix product over all
  // steps' tokens; attention runs per step over its own keys. Every step is checked first; an
  // error names the step and writes nothing.
  absl::Status ForwardBatch(std::span<const ModelStep> steps) const;

  // ModelRunner: the node pipeline's view (Run is ForwardBatch).
  uint32_t dim() const override { return config_.dim; }
  uint32_t targets() const override { return config_.targets; }
  uint32_t layers() const override { return config_.layers; }
  uint32_t kv_dim() const override { return config_.kv_dim(); }
  uint32_t max_positions() const override { return config_.max_positions; }
  absl::Status Run(std::span<const ModelStep> steps) override { return ForwardBatch(steps); }

  struct Weights;  // torch tensors; defined in hstu_weights.h (model .cc files only)

 private:
  HstuModel(const HstuConfig& config, std::unique_ptr<Weights> weights);
  const HstuConfig config_;
  std::unique_ptr<Weights> w_;
};

}  // namespace hlem::serving
