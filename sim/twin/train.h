#pragma once
// Training the allocator's PPO base policy in the twin (issue 7): generated traces of every
// regime, each replayed through a twin under the control loop (control.h) with one exploring
// controller per node (allocator::MakeExplorer): one PPO episode per node and trace.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator_service/core/ppo.h"
#include "sim/twin/control.h"
#include "sim/twin/twin.h"
#include "sim/workload/workload.h"

namespace hlem::sim {

// How training traces vary around the base workload (each drawn uniformly per trace).
struct TrainingSpread {
  absl::Duration length = absl::Seconds(180);
  double hot_lo = 0.1, hot_hi = 0.4;  // steady and start p_hot
  double trend_end_lo = 0.1, trend_end_hi = 0.6;
  double burst_lo = 0.4, burst_hi = 0.8;  // p_hot during a burst
  double bursts_per_hour_lo = 30, bursts_per_hour_hi = 90;
  double rate_lo = 0.7, rate_hi = 1.3;    // × the base rate
  double alpha_lo = 0.1, alpha_hi = 0.9;  // every node's α at the start
};

// Trace `index` of a training run: one phase of a regime drawn uniformly (steady, trend, burst)
// with its parameters drawn from `spread`, the base's other settings, its own workload seed; all
// keyed by (seed, index). `start_alpha` (may be null) gets the α the nodes start at.
WorkloadConfig TrainingWorkload(const WorkloadConfig& base, const TrainingSpread& spread,
                                uint64_t seed, uint64_t index, double* start_alpha);
// "steady 0.23", "trend 0.15->0.52", "burst 0.20/0.65 x48/h" (for logs).
std::string DescribeWorkload(const WorkloadConfig& w);

// The reward a training step gets for a closed window: ARCHITECTURE §3's (allocator::Reward)
// minus p99_weight · P99 ÷ SLO (capped as the features cap it). The §3 reward saturates at 1 when
// every request meets the SLO (at paper scale with 3 layers nearly every window, whatever α is),
// and then gives PPO no gradient; the small P99 term breaks those ties toward the lower P99, as
// the oracle's α*_t does (sim/twin/oracle.h). 0 leaves the §3 reward as it is.
double TrainingReward(const allocator::WindowState& w, double p99_weight);

// Replays `workload` (generated, not read from a file) through a twin of `options` starting at
// `start_alpha`, every node under an explorer of `agent` (keyed by seed and node); returns one
// episode per node. Each step's reward is then the cluster's for that window: the mean of the
// nodes' window rewards weighted by their requests. (With each node's own reward the policy
// learns to push load onto the other nodes: a node that lowers α loses EMB locality, the router
// sends it fewer requests and its own P99 improves while the cluster's gets worse.) The nodes'
// rewards are TrainingReward(window, p99_weight).
absl::StatusOr<std::vector<allocator::PpoEpisode>> CollectEpisodes(
    const TwinOptions& options, const WorkloadConfig& workload, double start_alpha,
    const allocator::PpoAgent& agent, uint64_t seed, const ControlOptions& control,
    const allocator::Bounds& bounds = {}, double p99_weight = 0);

}  // namespace hlem::sim
