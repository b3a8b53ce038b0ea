#pragma once
// XGBoost baseline (issue 7): a gradient-boosted tree model (libxgboost) of the next window's
// P99 given this window's state and the α chosen for the next, trained online on the node's own
// transitions; each window it predicts the P99 of every candidate α (α now + each action of
// kActions, clipped) and picks the lowest score (ties: the smaller move). Trees do not
// extrapolate: beyond the αs sampled their prediction is flat, and a greedy choice would never
// leave the range it started in. So the score is the prediction minus an optimism bonus,
// explore_bonus × min(1, distance from the candidate to the nearest sampled α ÷ explore_scale):
// an α not yet tried counts as a little better than predicted until it is tried.
//
// Sample: the 7 features of window t (ARCHITECTURE §3) and α_(t+1) → P99_(t+1) ÷ SLO, capped.
// Kept in a FIFO of `samples` transitions; the model is retrained from scratch on it every
// `retrain_every` windows (`rounds` trees of depth `max_depth`, learning rate `eta`, one thread,
// fixed seed: deterministic). Until min_samples transitions exist (and while every sample's next
// α is within min_spread of the others) α is dithered by ±dither instead (alternating), so the
// model sees α move. Training runs in Learn(), off the decision path; Decide only predicts.

#include <memory>

#include "absl/status/statusor.h"
#include "allocator_service/core/controller.h"

namespace hlem::allocator {

struct XgbOptions {
  size_t samples = 512;
  size_t min_samples = 8;
  int retrain_every = 1;
  int rounds = 30;
  int max_depth = 3;
  double eta = 0.3;
  double min_spread = 0.02;
  double dither = 0.04;
  double explore_bonus = 0.05;  // P99 ÷ SLO
  double explore_scale = 0.06;  // α
  uint64_t seed = 1;
  Bounds bounds;
};

absl::StatusOr<std::unique_ptr<Controller>> MakeXgbLatency(const XgbOptions& options = {});

}  // namespace hlem::allocator
