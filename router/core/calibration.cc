#include "router/core/calibration.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"

namespace hlem::router {

absl::StatusOr<std::unique_ptr<CostCalibrator>> CostCalibrator::Create(
    const CalibrationOptions& options, const ScorerOptions& configured) {
  if (!(options.half_life >= 1)) {
    return absl::InvalidArgumentError("calibration: half_life must be >= 1 answer");
  }
  ASSIGN_OR_RETURN(const Weights w, NormalisedWeights(configured));
  // After half_life steps of (1 - α), an old sample's weight has halved.
  const double alpha = 1 - std::pow(0.5, 1 / options.half_life);
  return std::unique_ptr<CostCalibrator>(new CostCalibrator(options, w, alpha));
}

void CostCalibrator::Mean::Add(double x, double alpha) {
  // The first samples get a plain mean so the start does not lean towards zero.
  ++n;
  const double step = std::max(alpha, 1.0 / static_cast<double>(n));
  value += step * (x - value);
}

void CostCalibrator::Observe(const CostSample& s) {
  absl::MutexLock lock(&mu_);
  history_.Add(s.history_tokens, alpha_);
  rows_.Add(static_cast<double>(s.emb_hits + s.emb_misses), alpha_);
  if (s.computed_tokens > 0 && s.compute_seconds > 0) {
    per_token_.Add(s.compute_seconds / s.computed_tokens, alpha_);
  }
  if (s.emb_misses > 0 && s.fetch_seconds > 0) {
    per_row_.Add(s.fetch_seconds / static_cast<double>(s.emb_misses), alpha_);
  }
  if (s.load >= 0 && std::isfinite(s.load) && s.queue_seconds >= 0) {
    const double l = std::min(1.0, s.load);
    queue_.Add(s.queue_seconds, alpha_);
    load_.Add(l, alpha_);
    queue_load_.Add(s.queue_seconds * l, alpha_);
    load_sq_.Add(l * l, alpha_);
  }
}

CalibrationState CostCalibrator::State() const {
  absl::MutexLock lock(&mu_);
  CalibrationState st;
  st.compute_samples = per_token_.n;
  st.fetch_samples = per_row_.n;
  st.load_samples = load_.n;
  st.weights = configured_;
  if (per_token_.n < options_.min_samples || per_row_.n < options_.min_samples) return st;
  st.c_kv = per_token_.value * history_.value;
  st.c_emb = per_row_.value * rows_.value;
  if (!(st.c_kv + st.c_emb > 0)) return st;
  st.calibrated = true;
  // The slope of queue wait on load (least squares over the weighted samples): a node waits for
  // the batch in progress whatever its load, and that intercept is not what load costs. Loads
  // that hardly vary say nothing about it (an idle cluster): the configured share stands.
  constexpr double kMinLoadVariance = 1e-6;  // a standard deviation of 0.001
  const double variance = load_sq_.value - load_.value * load_.value;
  if (load_.n >= options_.min_samples && variance > kMinLoadVariance) {
    st.c_load = std::max(0.0, (queue_load_.value - queue_.value * load_.value) / variance);
    const double sum = st.c_kv + st.c_emb + st.c_load;
    st.weights = {.kv = st.c_kv / sum, .emb = st.c_emb / sum, .load = st.c_load / sum};
    return st;
  }
  const double rest = 1 - configured_.load;
  st.weights = {.kv = rest * st.c_kv / (st.c_kv + st.c_emb),
                .emb = rest * st.c_emb / (st.c_kv + st.c_emb),
                .load = configured_.load};
  return st;
}

}  // namespace hlem::router
