#pragma once
// Fitting the cost model to one real run (`hlem sim fit`, docs/simulator.md): the node benchmark
// measures a node alone, but on the local cluster four nodes, two shards, the router and the load
// generator share two cores, so every CPU stage runs slower there than the benchmark says. The
// fit replays the real run's trace in the twin and rescales each stage's coefficients until the
// twin's per-stage medians equal the real run's (simulation matching: the twin's own processor
// sharing stays in the loop, so what is fitted is the part of the slow-down the twin does not
// model). Stages and what moves them:
//   router hop (latency − node time)   router_overhead, additively;
//   compute                            step_overhead × k, flops_per_second ÷ k;
//   lookup                             request_overhead × k, lookup_per_row × k;
//   fetch (requests that fetched)      fetch_overhead × k, fetch_per_row × k;
// with k = real median ÷ twin median. The link (copy stage) is the profile's configuration, not a
// fitted figure; its median is reported beside the others. Given the CPU the real run used per
// request (every process of the cluster and the load generator), background_cpu is set to what
// the twin's node work leaves of it, so that the twin's cores are as busy as the real ones (the
// contention that makes the real tail). Last, optionally, the per-request slowdown: the real CPU
// stages of each request over the twin's for the same request, as quantiles (CostModel::
// slowdown_quantiles: the stalls of a shared machine that processor sharing does not produce),
// and the stages matched again. Last, optionally, rounds of matching the end-to-end latency
// distribution: the per-request ratios above are ratios of two noisy times (the twin's own
// processor sharing already varies a request's stages), so as a slowdown they widen the body of
// the twin's distribution (more answers just over the SLO than the real run has) while the tail
// comes out right. Each round scales every slowdown quantile by real ÷ twin latency at the same
// quantile and keeps the round whose latency distribution is nearest the real one (the largest
// gap between the two CDFs, Kolmogorov–Smirnov: a bound on the SLO-fraction error at every
// threshold). Held-out runs (other regimes and α) validate the result (`hlem sim compare`).

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/twin/cost_model.h"
#include "sim/twin/twin.h"

namespace hlem::sim {

// Medians over the OK answers sent at or after the warm-up, in milliseconds.
struct StageMedians {
  uint64_t requests = 0;  // OK answers counted
  double hop_ms = 0;      // latency − node time: the hops and the router
  double queue_ms = 0, lookup_ms = 0, copy_ms = 0, compute_ms = 0;
  double fetch_ms = 0;  // over the answers that fetched rows
  double latency_ms = 0;
};
StageMedians MedianStages(std::span<const TwinOutcome> outcomes, uint64_t warmup_ns);

// The latencies of the OK answers sent at or after the warm-up, in milliseconds, sorted.
std::vector<double> SortedLatencies(std::span<const TwinOutcome> outcomes, uint64_t warmup_ns);

// The Kolmogorov–Smirnov distance of two latency samples (sorted): the largest difference of
// their empirical CDFs, so the fraction within any SLO differs by at most this much. 1 when
// either is empty.
double LatencyDistance(std::span<const double> a, std::span<const double> b);

struct FitOptions {
  int max_iterations = 8;
  double tolerance = 0.01;  // stop when every fitted stage is within this relative error
  // CPU seconds the real run used per request, all processes; 0 leaves background_cpu as it is.
  double real_cpu_per_request = 0;
  // Quantiles of the per-request slowdown to fit (CostModel::slowdown_quantiles); 0: none.
  int slowdown_quantiles = 0;
  // Twin runs matching the latency distribution after the slowdown fit (needs
  // slowdown_quantiles); 0: none. Stops early once the distance is within distance_tolerance.
  int latency_rounds = 0;
  double distance_tolerance = 0.005;
};

// One replay of the real run's trace under some costs.
struct SimulatedRun {
  std::vector<TwinOutcome> outcomes;
  TwinStats stats;
};

struct FitIteration {
  CostModel costs;       // what this iteration simulated
  StageMedians twin;     // what it gave
  double max_error = 0;  // the largest relative error of a fitted stage against the real run
  double distance = -1;  // LatencyDistance to the real run (latency rounds only; else −1)
};

struct FitResult {
  CostModel costs;       // the best iteration's costs
  double max_error = 0;  // and its largest stage error
  double distance = -1;  // and its LatencyDistance (latency rounds only; else −1)
  std::vector<FitIteration> iterations;
  bool converged = false;
};

// `real` are the real run's outcomes (with their stage timings; index = trace index). `simulate`
// replays the real run's trace under the given costs.
// A stage whose median is zero in either run (no fetches at all, say) keeps its coefficients.
// INVALID_ARGUMENT when the real run has no OK answers after the warm-up, or latency rounds are
// asked for without slowdown quantiles.
absl::StatusOr<FitResult> FitCosts(
    const CostModel& start, std::span<const TwinOutcome> real, uint64_t warmup_ns,
    const std::function<absl::StatusOr<SimulatedRun>(const CostModel&)>& simulate,
    const FitOptions& options = {});

}  // namespace hlem::sim
