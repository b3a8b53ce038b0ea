#pragma once
// The allocator's controllers (ARCHITECTURE §3): every decision interval each node's closed
// window comes in, α for that node and the reason go out. One interface for all of them — the
// SmartAllocator's parts and every baseline — so that the service, the digital twin and the
// tests drive them alike. No RPC here; a controller keeps per-node state and is called from one
// thread per node at a time (the service decides nodes in parallel with one instance per node).
//
// Signals (WindowState, the API's WindowStats) become the 7 features of ARCHITECTURE §3, each in
// [0, 1]; the reward of a window is SLO-satisfied fraction − λ·max(0, P99 − SLO), λ = 1/SLO.

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "allocator_service/core/mlp.h"

namespace hlem::allocator {

// One node's closed window, the fields the controllers read (WindowStats in the API).
struct WindowState {
  uint64_t index = 0;
  uint64_t requests = 0;
  double hot_user_ratio = 0;          // requests of users served here in the last hot windows
  double kv_hit_rate = 0;             // reused ÷ requested history tokens
  double emb_hit_rate = 0;            // rows from the EMB cache ÷ rows looked up
  double mean_seq_len_norm = 0;       // history tokens per request ÷ the configured maximum
  double slo_violation_fraction = 0;  // requests over the SLO ÷ requests
  double alpha = 0;                   // effective α during the window
  double p99_seconds = 0;
  double slo_seconds = 0;
  double p99_norm_cap = 4;  // P99 ÷ SLO is capped here before normalising
};

inline constexpr int kNumFeatures = 7;
// hot-user ratio, KV hit rate, EMB hit rate, mean sequence length, SLO-violation fraction, α,
// P99 ÷ SLO (capped, ÷ cap); each clamped to [0, 1].
std::array<double, kNumFeatures> Features(const WindowState& w);

// SLO-satisfied fraction − max(0, P99 − SLO) ÷ SLO (ARCHITECTURE §3), P99 ÷ SLO capped at
// p99_norm_cap as in the features and the oracle's reward (sim/twin/oracle.h): a window that
// fails outright scores −cap, not −∞.
double Reward(const WindowState& w);

// Δα of the learned controllers' action set.
inline constexpr std::array<double, 7> kActions = {-0.06, -0.04, -0.02, 0.0, 0.02, 0.04, 0.06};

enum class Reason : uint8_t {
  kStatic,    // a fixed α
  kHold,      // α kept: no usable window (no requests), or a move inside the adapter's deadband
  kPolicy,    // the base policy's action
  kRecovery,  // the recovery controller is active
  kBaseline,  // a baseline controller's own rule
};
const char* ReasonName(Reason reason);

struct Decision {
  double alpha = 0;
  Reason reason = Reason::kHold;
  std::string detail;  // one line: what the controller saw and did
};

struct Bounds {
  double alpha_min = 0.1;  // the learned controllers' clip range (configurable)
  double alpha_max = 0.9;
  double Clip(double alpha) const;
  bool Valid() const;  // 0 <= alpha_min <= alpha_max <= 1
};

class Controller {
 public:
  virtual ~Controller() = default;
  virtual std::string name() const = 0;
  // `history`: this node's closed windows, oldest first; the last one has just closed. Never
  // empty. Returns α for the next window. Called once per closed window, in order (controllers
  // may keep state between calls).
  virtual Decision Decide(std::span<const WindowState> history) = 0;
  // Slow work that must stay off the decision path (the online adapter's training): called once
  // after each Decide, once its α has been applied. Most controllers have none.
  virtual void Learn() {}
};

// A fixed α (static baselines: the oracle and the deployable static α; KV-only is α = 0). Not
// clipped: a static α is the experiment's choice.
std::unique_ptr<Controller> MakeStatic(double alpha);

// A frozen policy network (the PPO base policy alone, "PPO-only"): the actor maps the 7 features
// of the last window to one score per action of kActions; the best-scoring action is applied
// (deterministic at serving time), α clipped to the bounds. INVALID_ARGUMENT unless the actor has
// kNumFeatures inputs and kActions.size() outputs.
absl::StatusOr<std::unique_ptr<Controller>> MakePolicy(Mlp actor, const Bounds& bounds = {});
// A policy's actor from its weights file (hlem train-ppo --out), checked to fit MakePolicy:
// NOT_FOUND for a missing file, INVALID_ARGUMENT for a bad file or another shape.
absl::StatusOr<Mlp> LoadActor(const std::string& path);

// PID on the P99 error (a baseline): e = (P99 − target) ÷ SLO with target = target_fraction ·
// SLO; u = Kp·e + Ki·Σe + Kd·(e − e_prev); Δα = −direction · u, limited to ±max_step (the
// learned controllers' largest action) and α clipped to the bounds. P99 is not monotone in α
// (the interior optimum of ARCHITECTURE §8), so the sign of the plant is estimated online:
// `direction` is the sign of ΔP99 ÷ Δα over the last two windows when α moved by at least
// min_move and P99 by at least min_change ÷ SLO (kept otherwise; +1 at the start: "more EMB
// raises P99", so a P99 over the target first moves α toward KV). Windows without requests
// hold α. The integral is clamped to ±integral_limit (anti-windup).
struct PidOptions {
  double kp = 0.10, ki = 0.02, kd = 0.05;
  double target_fraction = 0.8;  // of the SLO
  double max_step = 0.06;
  double integral_limit = 3;
  double min_move = 0.01;    // Δα that counts as a move for the sign estimate
  double min_change = 0.02;  // |ΔP99| ÷ SLO that counts as a response
  Bounds bounds;
};
absl::StatusOr<std::unique_ptr<Controller>> MakePid(const PidOptions& options = {});

// The recovery controller of ARCHITECTURE §3 around another controller. It fires when the P99
// of 2 consecutive windows exceeds max(EMA + 3σ, 0.8·SLO), EMA (weight 2/11) and σ taken over
// the last 10 windows judged normal (a window over the bound does not join them, so a burst
// cannot raise its own bar; the first 10 windows are never judged); while active it bypasses
// `inner` and, when the hot-user ratio is above 0.2, lowers α toward KV by
// 0.15 × min(1, (P99 − bound) ÷ bound) per window (at most 0.15; by the excess, so a slight
// breach moves α slightly), clipped to the bounds, `bound` being the first window's over; it
// exits after 2 consecutive windows with P99 below the EMA + σ of the baseline before the
// incident, and `inner` resumes from the α it left. Stateful: call it once per closed window,
// in order.
struct RecoveryOptions {
  int history = 10;      // windows for EMA and σ
  int fire_windows = 2;  // consecutive windows over the bound to fire
  int exit_windows = 2;  // consecutive windows under EMA + σ to exit
  double sigmas = 3;     // bound = max(EMA + sigmas·σ, slo_fraction·SLO)
  double slo_fraction = 0.8;
  double hot_ratio = 0.2;  // lower α only above this hot-user ratio
  double max_step = 0.15;  // per window
  Bounds bounds;
};
absl::StatusOr<std::unique_ptr<Controller>> MakeRecovery(std::unique_ptr<Controller> inner,
                                                         const RecoveryOptions& options = {});

}  // namespace hlem::allocator
