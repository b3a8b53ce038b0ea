#pragma once
// Training side of the learned controllers (issue 7): a dense tanh network in double precision
// with its gradient, and Adam. Parameters and gradients are one flat vector each (Adam and the
// gradient-norm clip work on them whole). Single-threaded and deterministic: the same seed and the
// same data give the same weights bit for bit on one machine. The allocator runs the result
// frozen as an Mlp (mlp.h); the online adapter (adapter.h) trains one of these in the allocator,
// after its decisions: nothing here is on the decision path.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator_service/core/mlp.h"
#include "common/rng.h"

namespace hlem::allocator {

class TrainNet {
 public:
  // sizes: inputs, hidden widths..., outputs (at least 2 entries, all positive). Weights drawn
  // from N(0, 1 ÷ fan_in) (the last layer's scaled by out_gain: a small gain makes a policy start
  // near uniform), biases 0.
  TrainNet(std::vector<uint32_t> sizes, double out_gain, Rng& rng);

  // What Forward keeps for Backward: every layer's input (after the activation).
  struct Cache {
    std::vector<std::vector<double>> a;
  };
  // y = net(x): tanh hidden layers, a linear output. `cache` may be null.
  void Forward(std::span<const double> x, std::span<double> y, Cache* cache) const;
  // Adds to `grad` (size()) the gradient of a loss whose derivative by the outputs of the pass
  // `cache` recorded is `dy`.
  void Backward(const Cache& cache, std::span<const double> dy, std::span<double> grad) const;

  std::span<double> params() { return params_; }
  std::span<const double> params() const { return params_; }
  size_t size() const { return params_.size(); }
  uint32_t inputs() const { return sizes_.front(); }
  uint32_t outputs() const { return sizes_.back(); }
  // The network as the allocator runs it (float, tanh), behind `normaliser`.
  absl::StatusOr<Mlp> ToMlp(Normaliser normaliser) const;

 private:
  // Layer l: sizes_[l+1] rows of sizes_[l] weights at offset_[l], then sizes_[l+1] biases.
  const double* W(size_t l) const { return params_.data() + offset_[l]; }
  const double* B(size_t l) const { return W(l) + static_cast<size_t>(sizes_[l]) * sizes_[l + 1]; }
  std::vector<uint32_t> sizes_;
  std::vector<size_t> offset_;
  std::vector<double> params_;
};

// Adam (Kingma & Ba) over a flat parameter vector.
class Adam {
 public:
  explicit Adam(size_t n, double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8);
  void Step(std::span<double> params, std::span<const double> grad);
  void set_lr(double lr) { lr_ = lr; }

 private:
  double lr_, beta1_, beta2_, eps_;
  std::vector<double> m_, v_;
  double p1_ = 1, p2_ = 1;  // beta1^t, beta2^t
};

// Scales `grad` so its L2 norm is at most max_norm; returns the norm before.
double ClipGradNorm(std::span<double> grad, double max_norm);

// A standard normal draw from `rng` (Box-Muller on its raw output: the same stream everywhere).
double Gaussian(Rng& rng);

}  // namespace hlem::allocator
