#pragma once
// Online calibration of the scorer's miss costs (issue 5, beyond the paper): the paper's weights
// come from an offline profile and go stale when the model, the history lengths or the network
// change. The router learns C_kv and C_emb from the nodes' own answers instead:
//
//   per-token compute cost   t = compute_seconds ÷ computed_tokens      (answers that computed)
//   per-row fetch cost       r = emb_fetch_seconds ÷ emb_misses         (answers that missed)
//   Ĉ_kv  = t̄ · H̄,  H̄ = history tokens per request   (what a KV miss recomputes)
//   Ĉ_emb = r̄ · R̄,  R̄ = distinct rows per request    (what an EMB miss fetches)
//
//   load cost                Ĉ_ld = cov(q, l) ÷ var(l), the slope of q = the answer's queue
//                            wait on l = l(n) when routed (answers that carry their load)
//
// each an exponentially weighted mean over answers (`half_life` answers). With Ĉ_ld the three
// costs are all seconds — what a KV miss, an EMB miss and a fully loaded node each cost a request —
// and the weights are their shares Ĉ_i ÷ ΣĈ. Without load samples the load weight keeps its
// configured share w_ld = C_ld ÷ ΣC and KV and EMB split the rest as Ĉ_kv : Ĉ_emb. (Why the load
// cost is learnt too: at the paper profile a GPU's queue costs a request milliseconds per waiting
// cold request while an EMB miss costs ~0.1 µs a row, and with the configured share the router
// herded users onto EMB-local nodes: P99 +70 % at α 0.1, docs/simulator.md.) Until `min_samples`
// answers of each kind arrived, the configured weights stand. Thread-safe.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "router/core/policy.h"

namespace hlem::router {

struct CalibrationOptions {
  double half_life = 500;  // answers
  uint64_t min_samples = 50;
};

// What one answer of a node says about the costs.
struct CostSample {
  uint32_t computed_tokens = 0;
  uint32_t history_tokens = 0;
  uint64_t emb_hits = 0, emb_misses = 0;
  double compute_seconds = 0, fetch_seconds = 0;
  double queue_seconds = 0;  // waiting at the node before its work began
  double load = -1;          // l(n) when the router chose the node; < 0: not known
};

struct CalibrationState {
  double c_kv = 0, c_emb = 0;  // seconds per full miss (0 until calibrated)
  double c_load = 0;           // seconds of queue wait per unit of load (0 until learnt)
  uint64_t compute_samples = 0, fetch_samples = 0, load_samples = 0;
  bool calibrated = false;
  Weights weights;
};

class CostCalibrator {
 public:
  // INVALID_ARGUMENT for a half-life < 1 or configured costs NormalisedWeights rejects.
  static absl::StatusOr<std::unique_ptr<CostCalibrator>> Create(const CalibrationOptions& options,
                                                                const ScorerOptions& configured);
  void Observe(const CostSample& sample);
  CalibrationState State() const;

 private:
  CostCalibrator(const CalibrationOptions& options, const Weights& configured, double alpha)
      : options_(options), configured_(configured), alpha_(alpha) {}
  struct Mean {
    double value = 0;
    uint64_t n = 0;
    void Add(double x, double alpha);
  };
  const CalibrationOptions options_;
  const Weights configured_;
  const double alpha_;  // EWMA step
  mutable absl::Mutex mu_;
  Mean per_token_ ABSL_GUARDED_BY(mu_), history_ ABSL_GUARDED_BY(mu_);
  Mean per_row_ ABSL_GUARDED_BY(mu_), rows_ ABSL_GUARDED_BY(mu_);
  Mean queue_ ABSL_GUARDED_BY(mu_), load_ ABSL_GUARDED_BY(mu_);
  Mean queue_load_ ABSL_GUARDED_BY(mu_), load_sq_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::router
