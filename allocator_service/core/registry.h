#pragma once
// The controllers by name, one place for every front end (the allocator binary, `hlem sim run`,
// the evaluation): what each name is made of, what it needs, and a factory of per-node instances.
//
//   hlem          the SmartAllocator: PPO base policy + online adapter + recovery controller
//   ppo           PPO-only: the frozen base policy alone
//   ppo+adapter   PPO + online adapter (the ablation without recovery)
//   ppo+recovery  PPO + recovery (the ablation without the adapter)
//   static        a fixed α (oracle or deployable static α: the α is the experiment's choice)
//   kv_only       α = 0
//   recovery      the recovery controller around the static α
//   pid           PID on the P99 error, from the node's α
//   bo            Bayesian optimisation (GP + expected improvement), from the node's α
//   milp          a piecewise-linear latency model fitted online + a MILP (GLPK)
//   xgboost       an XGBoost model of the next window's P99 per candidate α
//   lstm          an LSTM (libtorch) predicting the next α, fine-tuned online, inside recovery;
//                 loaded from the plugin libhlem_lstm.so (allocator_service/lstm/plugin.cc) so
//                 that the binaries do not link libtorch: it is looked for in $HLEM_PLUGIN_DIR,
//                 the build tree's lib/, and <binary>/../lib/hlem

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "allocator_service/core/adapter.h"
#include "allocator_service/core/allocator.h"
#include "allocator_service/core/bayes_opt.h"
#include "allocator_service/core/controller.h"
#include "allocator_service/core/milp.h"
#include "allocator_service/core/xgb_latency.h"

namespace hlem::allocator {

inline constexpr std::array<std::string_view, 12> kControllerNames = {
    "hlem",     "ppo", "ppo+adapter", "ppo+recovery", "static",  "kv_only",
    "recovery", "pid", "bo",          "milp",         "xgboost", "lstm"};

struct ControllerSpec {
  std::string name = "hlem";
  std::string weights;  // the PPO actor (hlem train-ppo --out) for the ppo* and hlem controllers
  double alpha = 0.5;   // static, recovery
  Bounds bounds;        // the learned controllers', the recovery controller's and PID's
  uint64_t seed = 1;    // the adapter's and XGBoost's
  // The adapter's deadband (hlem, ppo+adapter): α moves only to a target at least this far from
  // where it stands (AdapterOptions::deadband; 0: every decision moves, as before 2026-12-06).
  double deadband = 0.1;
};
// The --deadband flag's help, the same in every front end (the allocator, hlem sim run).
inline constexpr char kDeadbandHelp[] =
    "hlem and ppo+adapter move a node's α only to a target at least this far from where it stands "
    "(0: every decision moves)";

// Checks the spec once (errors name the flag: --controller for an unknown name, --weights for a
// missing, unreadable or wrongly shaped actor, --alpha-min/--alpha-max for crossed bounds,
// --deadband outside [0, 1]) and returns a factory of fresh instances, one per node (incarnation).
absl::StatusOr<ControllerFactory> MakeControllerFactory(const ControllerSpec& spec);

}  // namespace hlem::allocator
