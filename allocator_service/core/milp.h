#pragma once
// MILP baseline (issue 7): a piecewise-linear model of the node's P99 in α, fitted online to its
// recent windows, and a mixed-integer program (GLPK) that picks the next α on it.
//
// Model: breakpoints b_0 < … < b_K spaced `breakpoint_step` over the bounds; P99 ÷ SLO (capped)
// at α is Σ_k φ_k(α)·v_k with φ the hat functions (linear interpolation between breakpoints). The
// values v are the weighted least-squares fit to the node's last `windows` windows with requests
// (weight fit_decay^age times a Gaussian kernel of the window's distance to the newest in
// hot-user ratio and sequence length, as the adapter's fit), plus smoothness · Σ (second
// difference of v)² — which also carries the fit linearly into breakpoints no window has visited —
// and a tiny pull to the mean so that the system is never singular.
//
// Program: minimise Σ_k λ_k·v_k + switch_cost·d over λ ∈ [0, 1]^(K+1), segment binaries
// z ∈ {0, 1}^K and d ≥ 0, with Σλ = 1, Σz = 1, λ_0 ≤ z_0, λ_k ≤ z_(k−1) + z_k, λ_K ≤ z_(K−1)
// (λ an SOS2 set: α lies on one segment), α = Σ λ_k·b_k, |α − α_now| ≤ max_step, d ≥ |α − α_now|.
// Solved by glp_intopt (branch and bound with presolve). Fewer than min_windows windows of this
// workload, or their α spread (weighted std) under min_spread: α is dithered by ±dither
// (alternating) instead, so that the fit sees α move (a greedy model with flat data never would).

#include <memory>

#include "absl/status/statusor.h"
#include "allocator_service/core/controller.h"

namespace hlem::allocator {

struct MilpOptions {
  int windows = 24;
  double fit_decay = 0.9;
  double workload_sigma = 0.1;
  double breakpoint_step = 0.05;
  double smoothness = 0.5;
  double switch_cost = 0.05;  // P99 ÷ SLO per unit of α moved
  double max_step = 0.1;
  int min_windows = 3;
  double min_spread = 0.015;
  double dither = 0.04;
  Bounds bounds;
};

absl::StatusOr<std::unique_ptr<Controller>> MakeMilp(const MilpOptions& options = {});

}  // namespace hlem::allocator
