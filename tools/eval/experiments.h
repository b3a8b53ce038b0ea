#pragma once
// The experiments of `hlem eval` (eval.h), one function each, in their own files.

#include <cstddef>

#include "absl/status/status.h"
#include "tools/eval/eval.h"

namespace hlem::eval {

// Experiment 1: KV-Opt, the oracle and deployable static α, HLEM per regime and depth
// (end_to_end.cc).
absl::Status EndToEnd(const EvalOptions& options, const Profile& profile, Stamp& stamp);
// Experiment 2: P99 against a static α per regime, long and short histories (alpha_sweep.cc).
absl::Status AlphaSweep(const EvalOptions& options, const Profile& profile, Stamp& stamp);
// Where the best α (index `best` of a grid of `grid` αs) lies: "yes" (interior) strictly inside
// the αs that served requests (indices first_served..last_served), otherwise which end it is.
const char* InteriorOptimum(size_t best, size_t first_served, size_t last_served, size_t grid);
// Experiment 3: the SmartAllocator's α against α*_t over time per regime (controllers.cc).
absl::Status Tracking(const EvalOptions& options, const Profile& profile, Stamp& stamp);
// Experiment 4: every controller's gap to α*_t, P99, SLO and decision time (controllers.cc).
absl::Status Controllers(const EvalOptions& options, const Profile& profile, Stamp& stamp);
// Experiment 5: the system and controller ablation ladders (ablations.cc).
absl::Status Ablations(const EvalOptions& options, const Profile& profile, Stamp& stamp);
// Experiment 6: routing policies at one static α (routing.cc).
absl::Status Routing(const EvalOptions& options, const Profile& profile, Stamp& stamp);
// Experiment 7: weak scaling, and the α chosen against hot-user ratio × cluster size (scale.cc).
absl::Status Scale(const EvalOptions& options, const Profile& profile, Stamp& stamp);
// The headline comparison with each cost coefficient at ×0.5 and ×2 (sensitivity.cc).
absl::Status Sensitivity(const EvalOptions& options, const Profile& profile, Stamp& stamp);

}  // namespace hlem::eval
