#pragma once
// LSTM baseline (issue 7), on libtorch: predicts the node's next α from its recent window states
// and fine-tunes online; run inside the recovery controller ("lstm" in the registry).
//
// Model: the 7 features (ARCHITECTURE §3) of the last `sequence` windows → torch::nn::LSTM
// (`hidden` units, one layer) → the last step's output → a linear head, zero-initialised, →
// α_next = α_now + max_step · tanh(head): a fresh model holds α (it was not pretrained: no
// offline data set of α labels is allowed it, and our twin's hindsight labels are what it
// fine-tunes on).
//
// Labels, without α* and without future windows: as the online adapter's (adapter.h), the local
// optimum of the reward in α over the node's recent windows of the same workload, when it is
// worth moving to (gain over its standard error), else α_now; the sample of window t is labelled
// in Learn() after window t's decision. Fine-tuning: `steps` Adam steps (learning rate `lr`) on
// minibatches of the FIFO replay (`replay` samples; half of each batch from the newest `recent`).
// When the recent αs are too close to fit, α is dithered by ±dither (alternating) so that they
// spread. Deterministic for a seed (libtorch's generator is seeded when the model is built; one
// thread decides a node at a time).

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "allocator_service/core/adapter.h"
#include "allocator_service/core/controller.h"

namespace hlem::allocator {

struct LstmOptions {
  int sequence = 8;
  int hidden = 16;
  double max_step = 0.1;
  double lr = 1e-2;
  size_t replay = 512;
  size_t batch = 32;
  size_t recent = 4;
  int steps = 8;
  double dither = 0.02;
  uint64_t seed = 1;
  AdapterOptions fit;  // the hindsight fit's parameters (fit_windows, kernel, confidence, ...)
  Bounds bounds;
};

absl::StatusOr<std::unique_ptr<Controller>> MakeLstm(const LstmOptions& options = {});

}  // namespace hlem::allocator
