#include "sim/twin/fit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hlem::sim {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (upper + *std::max_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(mid))) / 2;
}

double Ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }

// The relative error of a stage, or 0 when it cannot be fitted (zero in either run).
double RelError(double sim, double real) {
  return sim > 0 && real > 0 ? std::abs(sim - real) / real : 0;
}

// The largest relative error of a fitted stage.
double StageError(const StageMedians& t, const StageMedians& real) {
  return std::max({RelError(t.hop_ms, real.hop_ms), RelError(t.compute_ms, real.compute_ms),
                   RelError(t.lookup_ms, real.lookup_ms), RelError(t.fetch_ms, real.fetch_ms)});
}

// The sample's value at quantile p (0 < p < 1) of a sorted, non-empty sample.
double At(std::span<const double> sorted, double p) {
  const auto i = static_cast<size_t>(p * static_cast<double>(sorted.size()));
  return sorted[std::min(sorted.size() - 1, i)];
}

}  // namespace

std::vector<double> SortedLatencies(std::span<const TwinOutcome> outcomes, uint64_t warmup_ns) {
  std::vector<double> out;
  for (const TwinOutcome& o : outcomes) {
    if (o.code == absl::StatusCode::kOk && o.sent_ns >= warmup_ns) out.push_back(Ms(o.latency_ns));
  }
  std::sort(out.begin(), out.end());
  return out;
}

double LatencyDistance(std::span<const double> a, std::span<const double> b) {
  if (a.empty() || b.empty()) return 1;
  const auto na = static_cast<double>(a.size()), nb = static_cast<double>(b.size());
  double worst = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double x = std::min(a[i], b[j]);  // step both CDFs past every value equal to x
    while (i < a.size() && a[i] <= x) ++i;
    while (j < b.size() && b[j] <= x) ++j;
    worst = std::max(worst, std::abs(static_cast<double>(i) / na - static_cast<double>(j) / nb));
  }
  return worst;
}

StageMedians MedianStages(std::span<const TwinOutcome> outcomes, uint64_t warmup_ns) {
  std::vector<double> hop, queue, lookup, fetch, copy, compute, latency;
  for (const TwinOutcome& o : outcomes) {
    if (o.code != absl::StatusCode::kOk || o.sent_ns < warmup_ns) continue;
    hop.push_back(o.latency_ns > o.node_ns ? Ms(o.latency_ns - o.node_ns) : 0.0);
    queue.push_back(Ms(o.queue_ns));
    lookup.push_back(Ms(o.lookup_ns));
    if (o.fetch_ns > 0) fetch.push_back(Ms(o.fetch_ns));
    copy.push_back(Ms(o.copy_ns));
    compute.push_back(Ms(o.compute_ns));
    latency.push_back(Ms(o.latency_ns));
  }
  return {.requests = hop.size(),
          .hop_ms = Median(std::move(hop)),
          .queue_ms = Median(std::move(queue)),
          .lookup_ms = Median(std::move(lookup)),
          .copy_ms = Median(std::move(copy)),
          .compute_ms = Median(std::move(compute)),
          .fetch_ms = Median(std::move(fetch)),
          .latency_ms = Median(std::move(latency))};
}

absl::StatusOr<FitResult> FitCosts(
    const CostModel& start, std::span<const TwinOutcome> real_outcomes, uint64_t warmup_ns,
    const std::function<absl::StatusOr<SimulatedRun>(const CostModel&)>& simulate,
    const FitOptions& options) {
  const StageMedians real = MedianStages(real_outcomes, warmup_ns);
  if (real.requests == 0) {
    return absl::InvalidArgumentError("the real run has no OK answers after the warm-up");
  }
  if (options.max_iterations < 1) {
    return absl::InvalidArgumentError("max_iterations must be at least 1");
  }
  if (options.latency_rounds > 0 && options.slowdown_quantiles <= 0) {
    return absl::InvalidArgumentError(
        "latency rounds shape the slowdown quantiles: slowdown_quantiles must be set too");
  }
  FitResult result;
  CostModel costs = start;
  SimulatedRun last;
  // Rescales the stages (and the background) until the medians match; keeps the best costs.
  auto match = [&]() -> absl::Status {
    double best = HUGE_VAL;
    result.converged = false;
    for (int i = 0; i < options.max_iterations; ++i) {
      absl::StatusOr<SimulatedRun> run = simulate(costs);
      if (!run.ok()) return run.status();
      FitIteration it{.costs = costs, .twin = MedianStages(run->outcomes, warmup_ns)};
      if (it.twin.requests == 0) {
        return absl::FailedPreconditionError(
            "the twin answered nothing OK after the warm-up under these costs");
      }
      const StageMedians& t = it.twin;
      it.max_error = StageError(t, real);
      // The background the real CPU calls for, given this run's node work.
      absl::Duration background = costs.background_cpu;
      if (options.real_cpu_per_request > 0 && run->stats.requests > 0) {
        const double node =
            absl::ToDoubleSeconds(run->stats.node_cpu) / static_cast<double>(run->stats.requests);
        background = absl::Seconds(std::max(0.0, options.real_cpu_per_request - node));
        it.max_error =
            std::max(it.max_error,
                     absl::ToDoubleSeconds(absl::AbsDuration(background - costs.background_cpu)) /
                         options.real_cpu_per_request);
      }
      result.iterations.push_back(it);
      if (it.max_error < best) {
        best = it.max_error;
        result.costs = costs;
        result.max_error = best;
        last = std::move(*run);
      }
      if (it.max_error <= options.tolerance) {
        result.converged = true;
        break;
      }
      // The next guess, stage by stage; the background is what the nodes' work leaves of the
      // real CPU per request (the nodes' work changes with the stages' coefficients).
      costs.background_cpu = background;
      costs.router_overhead =
          std::max(absl::ZeroDuration(),
                   costs.router_overhead +
                       absl::Nanoseconds(static_cast<int64_t>((real.hop_ms - t.hop_ms) * 1e6)));
      if (t.compute_ms > 0 && real.compute_ms > 0) {
        const double k = real.compute_ms / t.compute_ms;
        costs.step_overhead *= k;
        costs.flops_per_second /= k;
      }
      if (t.lookup_ms > 0 && real.lookup_ms > 0) {
        const double k = real.lookup_ms / t.lookup_ms;
        costs.request_overhead *= k;
        costs.lookup_per_row *= k;
      }
      if (t.fetch_ms > 0 && real.fetch_ms > 0) {
        const double k = real.fetch_ms / t.fetch_ms;
        costs.fetch_overhead *= k;
        costs.fetch_per_row *= k;
      }
    }
    costs = result.costs;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(match());
  if (options.slowdown_quantiles > 0) {
    // What the twin's stage times do not explain, request by request: the real CPU stages
    // (hops, lookup, fetch, compute) over the twin's for the same request, the median scaled
    // to 1; then the stages are matched again with that slowdown in place.
    auto cpu_ms = [](const TwinOutcome& o) {
      const uint64_t hop = o.latency_ns > o.node_ns ? o.latency_ns - o.node_ns : 0;
      return Ms(hop + o.lookup_ns + o.fetch_ns + o.compute_ns);
    };
    absl::flat_hash_map<uint64_t, double> by_index;
    for (const TwinOutcome& o : last.outcomes) {
      if (o.code == absl::StatusCode::kOk) by_index[o.index] = cpu_ms(o);
    }
    std::vector<double> ratios;
    for (const TwinOutcome& o : real_outcomes) {
      if (o.code != absl::StatusCode::kOk || o.sent_ns < warmup_ns) continue;
      auto it = by_index.find(o.index);
      if (it != by_index.end() && it->second > 0) ratios.push_back(cpu_ms(o) / it->second);
    }
    if (ratios.size() < static_cast<size_t>(options.slowdown_quantiles)) {
      return absl::InvalidArgumentError(
          absl::StrCat("too few requests answered in both runs (", ratios.size(), ") for ",
                       options.slowdown_quantiles, " slowdown quantiles"));
    }
    std::sort(ratios.begin(), ratios.end());
    const double median = ratios[ratios.size() / 2];
    costs.slowdown_quantiles.clear();
    for (int i = 0; i < options.slowdown_quantiles; ++i) {
      const double p = (i + 0.5) / options.slowdown_quantiles;
      const auto at = std::min(ratios.size() - 1, static_cast<size_t>(p * ratios.size()));
      costs.slowdown_quantiles.push_back(std::max(1e-3, ratios[at] / median));
    }
    RETURN_IF_ERROR(match());
  }
  if (options.latency_rounds > 0) {
    // Round 0 runs the matched costs; each round scales slowdown quantile i by real ÷ twin
    // latency at quantile (i + ½) / n, kept non-decreasing, for the next. The stage
    // coefficients stay; the round nearest the real run is kept.
    const std::vector<double> real_ms = SortedLatencies(real_outcomes, warmup_ns);
    double best = HUGE_VAL;
    for (int round = 0; round < options.latency_rounds; ++round) {
      absl::StatusOr<SimulatedRun> run = simulate(costs);
      if (!run.ok()) return run.status();
      const std::vector<double> twin_ms = SortedLatencies(run->outcomes, warmup_ns);
      if (twin_ms.empty()) {
        return absl::FailedPreconditionError(
            "the twin answered nothing OK after the warm-up under these costs");
      }
      FitIteration it{.costs = costs, .twin = MedianStages(run->outcomes, warmup_ns)};
      it.max_error = StageError(it.twin, real);
      it.distance = LatencyDistance(real_ms, twin_ms);
      result.iterations.push_back(it);
      if (it.distance < best) {
        best = it.distance;
        result.costs = costs;
        result.max_error = it.max_error;
        result.distance = it.distance;
      }
      if (it.distance <= options.distance_tolerance) break;
      std::vector<double>& q = costs.slowdown_quantiles;
      const auto n = static_cast<double>(q.size());
      for (size_t i = 0; i < q.size(); ++i) {
        const double p = (static_cast<double>(i) + 0.5) / n;
        q[i] = std::max(1e-3, q[i] * At(real_ms, p) / std::max(1e-6, At(twin_ms, p)));
        if (i > 0) q[i] = std::max(q[i], q[i - 1]);
      }
    }
    costs = result.costs;
  }
  return result;
}

}  // namespace hlem::sim
