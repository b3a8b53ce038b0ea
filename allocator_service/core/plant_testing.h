#pragma once
// Tests only: a synthetic serving node for the controllers, whose window reward peaks at a known
// α* that the test moves (a workload shift), and a loop that runs a controller on it.

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "allocator_service/core/controller.h"

namespace hlem::allocator::testing {

inline constexpr double kPlantSlo = 0.030;

// A synthetic node whose window reward peaks at a known α*: P99 ÷ SLO = floor + curvature·(α −
// α*)², times a seeded noise of 3 % (the same draw for every controller in a window: common random
// numbers), the hit rates move with α and the regime as on a real node.
struct Regime {
  double alpha_star;
  double hot_ratio;
  double seq_len_norm;
  double floor = 1.3;  // P99 ÷ SLO at α*
  double curvature = 12;
};

inline WindowState PlantWindow(uint64_t index, const Regime& r, double alpha, double noise) {
  const double p99_norm =
      (r.floor + r.curvature * (alpha - r.alpha_star) * (alpha - r.alpha_star)) *
      (1 + 0.03 * noise);
  return {.index = index,
          .requests = 2000,
          .hot_user_ratio = r.hot_ratio,
          .kv_hit_rate = (0.3 + 0.8 * r.hot_ratio) * (1 - 0.5 * alpha),
          .emb_hit_rate = 0.3 + 0.6 * std::sqrt(alpha),
          .mean_seq_len_norm = r.seq_len_norm,
          .slo_violation_fraction = std::min(1.0, 0.02 * std::pow(p99_norm, 3)),
          .alpha = alpha,
          .p99_seconds = p99_norm * kPlantSlo,
          .slo_seconds = kPlantSlo};
}

// Runs `c` through `regimes` (one per window) from α0; returns the α of every window.
inline std::vector<double> RunPlant(Controller& c, const std::vector<Regime>& regimes,
                                    double alpha0, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g;
  std::vector<WindowState> history;
  std::vector<double> alphas;
  double alpha = alpha0;
  for (size_t t = 0; t < regimes.size(); ++t) {
    alphas.push_back(alpha);
    history.push_back(PlantWindow(t, regimes[t], alpha, g(rng)));
    if (history.size() > 64) history.erase(history.begin());
    const Decision d = c.Decide(history);
    c.Learn();
    alpha = d.alpha;
  }
  return alphas;
}

// Mean |α − α*| over the windows [from, to) of `alphas`.
inline double MeanGap(const std::vector<double>& alphas, size_t from, size_t to,
                      double alpha_star) {
  double sum = 0;
  for (size_t t = from; t < to; ++t) sum += std::abs(alphas[t] - alpha_star);
  return sum / static_cast<double>(to - from);
}

}  // namespace hlem::allocator::testing
