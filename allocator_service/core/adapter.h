#pragma once
// The online adapter of the SmartAllocator (ARCHITECTURE §3): a 5 → 16 → 1 network that adds a
// residual Δα to a frozen base policy's α and learns online, off the decision path, from what
// the node's own windows show. docs/allocator.md ("The online adapter") has the reasoning.
//
// Inputs (5, each of the ARCHITECTURE §3 features mapped from [0, 1] to [-1, 1]): hot-user
// ratio, KV hit rate, EMB hit rate, P99 ÷ SLO (capped) and α — what says where the workload is
// and where the node stands on it. Sequence length and the SLO-violation fraction are left out:
// the first moves slowly and is covered by the hit rates, the second duplicates P99.
//
// Output: an offset Δα = max_offset · tanh(z), z the network's linear output, on the base
// policy's own α: the base steers α as it would alone (PPO-only's trajectory: it is shown each
// window with its own α in place of the applied one) and the node gets α_base + Δα, clipped. An
// offset on the base's level and not on its step: the PPO policy acts in steps of at most 0.06 and
// pulls back toward its own fixed point every window, so a step residual bounded like its actions
// can hold α at most one action away from where PPO wants it. The offset's bound is a trust
// region: the adapter never sets a node more than max_offset from the frozen policy. The output
// layer starts at zero, so a fresh adapter is the base policy exactly. The base's α is re-anchored
// on the node's α whenever the adapter did not decide the window before (after the recovery
// controller held the node, the base resumes from the α recovery left, as PPO-only would).
//
// Target (the loss's label), from hindsight and without α* labels: the node's last fit_windows
// windows give (α during the window, reward of the window) pairs; a weighted least-squares
// quadratic reward(α) — weights fit_decay^age times a Gaussian kernel (width workload_sigma) of
// the window's distance to the newest in hot-user ratio and sequence length, so that windows of
// another workload (before a shift) do not count; at least 3 effective windows — yields the local
// optimum α̂ — the vertex when the fit is concave, else the better end — kept within `reach` of the
// α range seen and inside the bounds. The label of the decision made on the newest window is y =
// clamp(α̂ − α_base, ±max_offset), α_base being the base policy's α; when the predicted gain of α̂
// over α_base is under min_gain, or under `confidence` standard errors of itself (the fit's
// residual noise carried through the weighted least squares), the label is 0: the base policy is
// as good, as far as the windows tell (window rewards are noisy: without this test a steady node's
// adapter learns offsets from noise). When the recent αs are too close to fit (spread under
// min_spread) the window teaches nothing, and the applied α is dithered by ±dither (alternating
// sign) so that the next windows can.
//
// Loss: ½ (Δα(x) − y)², averaged over a minibatch of the replay (a FIFO of `replay` labelled
// windows; half of each batch from the newest `recent` entries, half uniform: after a shift
// the new regime's few windows are not drowned by a thousand old ones). Adam with learning rate
// η = η0 · min(|ℓ − ℓ_EMA| ÷ SLO, cap), ℓ the newest window's P99 and ℓ_EMA its exponential
// average before it: the adapter learns fast when the latency moves (a workload shift) and
// hardly at all when it is steady.
//
// Decide() runs the base policy and one forward pass and records the sample; Learn() (after the
// α has been applied: the allocator calls it after its pushes, the twin after SetAlpha) labels the
// sample and runs `steps` Adam steps. Deterministic for a seed.
//
// Deadband: moving α costs on the real cluster whatever the size of the move (refill traffic and
// the K/V or EMB content a shrinking side loses: docs/allocator.md, "Why the SmartAllocator holds
// still"), so with deadband > 0 the node keeps its α until base + offset is at least `deadband`
// away; the base policy meanwhile steers its own α as before, so a drift is followed in jumps of
// at least `deadband`. No dither then: a ±dither move is held anyway.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator_service/core/controller.h"

namespace hlem::allocator {

struct AdapterOptions {
  uint32_t hidden = 16;
  double max_offset = 0.3;  // |Δα| bound: the farthest from the base policy's α
  double eta0 = 1e-3;
  double eta_cap = 4;         // |ℓ − ℓ_EMA| ÷ SLO is capped here
  double latency_ema = 0.05;  // weight of the newest P99 in ℓ_EMA (a baseline of ~20 windows)
  size_t replay = 1024;
  size_t batch = 32;
  size_t recent = 4;  // half of each batch comes from the newest this many samples
  int steps = 128;    // Adam steps per labelled window
  int fit_windows = 12;
  double fit_decay = 0.85;      // weight per window of age in the local fit
  double workload_sigma = 0.1;  // kernel width in hot-user ratio and sequence length
  double min_spread = 0.015;    // weighted std of α under which the fit is not trusted
  double dither = 0.02;
  double reach = 0.1;         // α̂ at most this far outside the α range fitted
  double min_gain = 0.005;    // predicted reward gain of α̂ over α_base to act on ...
  double confidence = 2;      // ... and at least this many standard errors of that gain
  double noise_floor = 0.01;  // the least reward noise (σ) the fit assumes
  // α moves only to a target at least this far from where it stands (0: every decision moves;
  // > 0 also turns the dither off). The SmartAllocator's is ControllerSpec::deadband.
  double deadband = 0;
  uint64_t seed = 1;
  Bounds bounds;
};

// η = η0 · min(|latency − ema| ÷ slo, cap); 0 for slo ≤ 0.
double AdapterLearningRate(const AdapterOptions& o, double latency, double ema, double slo);

// The local optimum of the windows' reward in α (the adapter's hindsight target), or nothing when
// the windows cannot tell (under 3 effective windows of this workload, α spread under min_spread).
struct LocalOptimum {
  double alpha = 0;
  double spread = 0;  // weighted std of α over the windows fitted
  // The fit: reward ≈ coef · (1, u, u²), u = α − mean, and the coefficients' covariance.
  double mean = 0;
  std::array<double, 3> coef{};
  std::array<std::array<double, 3>, 3> cov{};
  // Fitted reward at `alpha` minus fitted reward at `from`, and its standard error.
  double Gain(double from) const;
  double GainStderr(double from) const;
  // Gain(from) ≥ max(min_gain, confidence · GainStderr(from)): worth moving from `from`.
  bool WorthMoving(double from, const AdapterOptions& o) const;
};
std::optional<LocalOptimum> FitLocalOptimum(std::span<const WindowState> history,
                                            const AdapterOptions& o);

// The adapter around `base` (the PPO policy). INVALID_ARGUMENT for bad options or no base.
absl::StatusOr<std::unique_ptr<Controller>> MakeAdapter(std::unique_ptr<Controller> base,
                                                        const AdapterOptions& options = {});

}  // namespace hlem::allocator
