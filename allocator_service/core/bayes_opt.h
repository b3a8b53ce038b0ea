#pragma once
// Bayesian optimisation baseline (issue 7): per node, a Gaussian process over (α, hot-user
// ratio, sequence length) fitted to the rewards of the node's recent windows, and expected
// improvement over a grid of α at the newest window's workload. Contextual: the workload inputs
// let it tell a shift from noise, as a plain GP over α alone could not. No α* labels, no future
// windows: only the windows the node has closed.
//
// GP: zero-mean prior on the standardised reward (mean and standard deviation of the windows
// fitted, the deviation at least min_reward_std), squared-exponential kernel with length scales
// (alpha_scale, context_scale, context_scale), noise variance `noise` (standardised units);
// posterior by Cholesky (Eigen). EI(α) = (μ − best − ξ)Φ(z) + σφ(z), z = (μ − best − ξ)/σ, best
// the highest posterior mean at the windows fitted (noisy EI). The next α is the grid point of
// highest EI within max_step of the current α (a trust region: without it BO jumps across the
// whole range while it explores, and every jump costs a refill), clipped to the bounds. Fewer than
// 2 windows with requests: α is held.

#include <memory>

#include "absl/status/statusor.h"
#include "allocator_service/core/controller.h"

namespace hlem::allocator {

struct BayesOptOptions {
  int windows = 24;            // the newest windows with requests fitted
  double alpha_scale = 0.12;   // kernel length scale in α
  double context_scale = 0.1;  // ... in hot-user ratio and sequence length
  double noise = 0.1;          // observation noise variance (standardised reward)
  double xi = 0.01;            // EI's exploration margin (standardised)
  double grid_step = 0.02;
  double max_step = 0.2;
  double min_reward_std = 0.02;
  Bounds bounds;
};

absl::StatusOr<std::unique_ptr<Controller>> MakeBayesOpt(const BayesOptOptions& options = {});

}  // namespace hlem::allocator
