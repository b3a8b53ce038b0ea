#include "sim/twin/train.h"

#include <algorithm>
#include <memory>
#include <span>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace hlem::sim {
namespace {

// Uniform in [lo, hi) from a keyed draw.
double Draw(uint64_t seed, uint64_t index, uint64_t what, double lo, double hi) {
  const double u = static_cast<double>(KeyedHash(seed, index, what) >> 11) /
                   static_cast<double>(uint64_t{1} << 53);
  return lo + (hi - lo) * u;
}

// Logs every closed window's reward and requests into the cluster's table, then lets the
// explorer decide.
class ClusterRewardLog final : public allocator::Controller {
 public:
  ClusterRewardLog(std::unique_ptr<allocator::Controller> inner,
                   absl::flat_hash_map<uint64_t, std::pair<double, double>>* cluster,
                   double p99_weight)
      : inner_(std::move(inner)), cluster_(*cluster), p99_weight_(p99_weight) {}
  std::string name() const override { return inner_->name(); }
  allocator::Decision Decide(std::span<const allocator::WindowState> history) override {
    const allocator::WindowState& w = history.back();
    const double requests = static_cast<double>(w.requests);
    cluster_[w.index].first += requests * TrainingReward(w, p99_weight_);
    cluster_[w.index].second += requests;
    return inner_->Decide(history);
  }
  void Learn() override { inner_->Learn(); }

 private:
  std::unique_ptr<allocator::Controller> inner_;
  absl::flat_hash_map<uint64_t, std::pair<double, double>>& cluster_;
  const double p99_weight_;
};

}  // namespace

double TrainingReward(const allocator::WindowState& w, double p99_weight) {
  const double reward = allocator::Reward(w);
  if (p99_weight == 0 || w.slo_seconds <= 0) return reward;
  const double cap = w.p99_norm_cap > 1 ? w.p99_norm_cap : 1;
  return reward - p99_weight * std::min(w.p99_seconds / w.slo_seconds, cap);
}

WorkloadConfig TrainingWorkload(const WorkloadConfig& base, const TrainingSpread& s, uint64_t seed,
                                uint64_t index, double* start_alpha) {
  WorkloadConfig w = base;
  w.seed = KeyedHash(seed, index, 0x73656564);  // "seed"
  w.rate = base.rate * Draw(seed, index, 1, s.rate_lo, s.rate_hi);
  Phase p{.duration = s.length, .hot_ratio = Draw(seed, index, 2, s.hot_lo, s.hot_hi)};
  const double regime = Draw(seed, index, 3, 0, 3);
  if (regime < 1) {
    p.regime = Regime::kSteady;
  } else if (regime < 2) {
    p.regime = Regime::kTrend;
    p.hot_ratio_end = Draw(seed, index, 4, s.trend_end_lo, s.trend_end_hi);
  } else {
    p.regime = Regime::kBurst;
    p.burst_ratio = Draw(seed, index, 5, s.burst_lo, s.burst_hi);
    p.bursts_per_hour = Draw(seed, index, 6, s.bursts_per_hour_lo, s.bursts_per_hour_hi);
    p.burst_min_windows = 2;
    p.burst_max_windows = 6;
  }
  w.phases = {p};
  if (start_alpha != nullptr) *start_alpha = Draw(seed, index, 7, s.alpha_lo, s.alpha_hi);
  return w;
}

std::string DescribeWorkload(const WorkloadConfig& w) {
  std::string out = absl::StrFormat("rate %.0f/s", w.rate);
  for (const Phase& p : w.phases) {
    switch (p.regime) {
      case Regime::kSteady:
        absl::StrAppendFormat(&out, ", steady %.2f", p.hot_ratio);
        break;
      case Regime::kTrend:
        absl::StrAppendFormat(&out, ", trend %.2f->%.2f", p.hot_ratio, p.hot_ratio_end);
        break;
      case Regime::kBurst:
        absl::StrAppendFormat(&out, ", burst %.2f/%.2f x%.0f/h", p.hot_ratio, p.burst_ratio,
                              p.bursts_per_hour);
        break;
    }
  }
  return out;
}

absl::StatusOr<std::vector<allocator::PpoEpisode>> CollectEpisodes(
    const TwinOptions& options, const WorkloadConfig& workload, double start_alpha,
    const allocator::PpoAgent& agent, uint64_t seed, const ControlOptions& control,
    const allocator::Bounds& bounds, double p99_weight) {
  TwinOptions o = options;
  o.alpha = start_alpha;
  ASSIGN_OR_RETURN(std::unique_ptr<Twin> twin, Twin::Create(o, workload));
  ASSIGN_OR_RETURN(std::unique_ptr<WorkloadGenerator> gen, WorkloadGenerator::Create(workload));
  std::vector<allocator::PpoEpisode> episodes(twin->num_nodes());
  // Window index → (Σ requests · reward, Σ requests) over the nodes.
  absl::flat_hash_map<uint64_t, std::pair<double, double>> cluster;
  size_t next_node = 0;
  absl::Status made;
  auto make = [&]() -> std::unique_ptr<allocator::Controller> {
    const size_t i = next_node++;
    absl::StatusOr<std::unique_ptr<allocator::Controller>> c =
        allocator::MakeExplorer(agent, KeyedHash(seed, i), &episodes[i], bounds);
    if (!c.ok()) {
      made = c.status();
      return nullptr;
    }
    return std::make_unique<ClusterRewardLog>(std::move(*c), &cluster, p99_weight);
  };
  // With sketched histories a first visit's events are not drawn (the twin sketches them).
  const WorkloadGenerator::Events events = options.history_sketch
                                               ? WorkloadGenerator::Events::kReturning
                                               : WorkloadGenerator::Events::kAll;
  absl::StatusOr<std::vector<ControlRecord>> records = RunControlled(
      *twin, [&](TraceRequest* r) { return gen->Next(r, events); }, make, control);
  RETURN_IF_ERROR(made);
  RETURN_IF_ERROR(records.status());
  // Each step's reward becomes the cluster's for its window.
  for (allocator::PpoEpisode& e : episodes) {
    for (allocator::PpoStep& step : e.steps) {
      const auto it = cluster.find(step.window);
      if (it != cluster.end() && it->second.second > 0) {
        step.reward = it->second.first / it->second.second;
      }
    }
  }
  return episodes;
}

}  // namespace hlem::sim
