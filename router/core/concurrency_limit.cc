#include "router/core/concurrency_limit.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace hlem::router {
namespace {

// Samples kept per interval; beyond, the rest of it is not sampled (bounded memory).
constexpr size_t kMaxSamples = 1 << 16;

bool Positive(absl::Duration d) { return d > absl::ZeroDuration() && d < absl::InfiniteDuration(); }

}  // namespace

absl::Status ConcurrencyLimit::Validate(const ConcurrencyLimitOptions& o) {
  auto bad = [](const char* field, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("concurrency_limit.", field, ": ", what));
  };
  if (o.min_limit == 0) return bad("min_limit", "must be ≥ 1");
  if (o.max_limit < o.min_limit) return bad("max_limit", "must be ≥ min_limit");
  if (o.initial_limit < o.min_limit || o.initial_limit > o.max_limit) {
    return bad("initial_limit", "must be within [min_limit, max_limit]");
  }
  if (!(o.tolerance >= 1) || !std::isfinite(o.tolerance)) return bad("tolerance", "must be ≥ 1");
  if (!(o.percentile > 0 && o.percentile <= 1)) return bad("percentile", "must be in (0, 1]");
  if (!Positive(o.interval)) return bad("interval", "must be > 0 and finite");
  if (!Positive(o.rebaseline_every)) return bad("rebaseline_every", "must be > 0 and finite");
  if (!Positive(o.first_baseline_within)) {
    return bad("first_baseline_within", "must be > 0 and finite");
  }
  if (o.min_samples == 0) return bad("min_samples", "must be ≥ 1");
  if (o.baseline_samples == 0) return bad("baseline_samples", "must be ≥ 1");
  return absl::OkStatus();
}

ConcurrencyLimit::ConcurrencyLimit(const ConcurrencyLimitOptions& options, Clock& clock)
    : options_(options), clock_(clock), limit_(options.initial_limit) {
  absl::MutexLock lock(&mu_);
  last_uncrowded_ = interval_start_ = clock_.Now();
}

uint32_t ConcurrencyLimit::Allowed() const {
  return baseline_phase_ ? options_.min_limit : static_cast<uint32_t>(limit_);
}

void ConcurrencyLimit::StartInterval(absl::Time now) {
  samples_.clear();
  interval_start_ = now;
  peak_in_flight_ = std::min(in_flight_, Allowed());
}

absl::Duration ConcurrencyLimit::Percentile(std::vector<absl::Duration>& samples) const {
  // The smallest sample with at least `percentile` of them at or below it (percentile > 0).
  const double rank = std::ceil(options_.percentile * static_cast<double>(samples.size()));
  const size_t k = std::min(samples.size(), std::max<size_t>(1, static_cast<size_t>(rank))) - 1;
  std::nth_element(samples.begin(), samples.begin() + static_cast<ptrdiff_t>(k), samples.end());
  return samples[k];
}

void ConcurrencyLimit::Advance(absl::Time now) {
  if (baseline_phase_) return;  // ends with its samples (Release)
  if (now - last_uncrowded_ >=
      (stats_.baselines == 0 ? options_.first_baseline_within : options_.rebaseline_every)) {
    // The router was busy for that long (no call started uncrowded): hold the calls at min_limit
    // until enough have run uncrowded. The samples gathered so far may be old; the phase takes
    // fresh ones.
    baseline_phase_ = true;
    baseline_samples_.clear();
    ++stats_.forced_baselines;
    return;
  }
  // No baseline yet: nothing to compare with; the limit stays initial_limit.
  if (stats_.baselines == 0) return;
  if (now - interval_start_ < options_.interval || samples_.size() < options_.min_samples) return;
  const absl::Duration sample = Percentile(samples_);
  const double target = options_.tolerance * absl::ToDoubleSeconds(baseline_);
  const double gradient =
      std::clamp(target / std::max(1e-9, absl::ToDoubleSeconds(sample)), 0.5, 2.0);
  double next = limit_ * gradient;
  if (gradient > 1) {
    // Growth only where the limit was used: a limit far above the calls in flight says nothing
    // about what more calls would cost.
    next = 2 * peak_in_flight_ >= limit_ ? std::max(next, limit_ + 1) : limit_;
  } else if (peak_in_flight_ < static_cast<uint32_t>(limit_)) {
    // Shrinking only where the limit was reached: while it holds nobody back, the latency is not
    // the router's queue (a slow spell of the machine, a slow shard), and a lower limit would
    // refuse the next burst without making anything faster.
    next = limit_;
  }
  limit_ = std::clamp(next, static_cast<double>(options_.min_limit),
                      static_cast<double>(options_.max_limit));
  ++stats_.updates;
  StartInterval(now);
}

bool ConcurrencyLimit::Acquire(Ticket* ticket) {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  // A call that starts with few in flight (after an idle spell too) shows the router is not
  // busy: no phase at min_limit is needed to find uncrowded calls.
  if (in_flight_ < options_.min_limit) last_uncrowded_ = now;
  Advance(now);
  ticket->limit = Allowed();
  ticket->baseline = baseline_;
  ticket->measuring_baseline = baseline_phase_;
  if (in_flight_ >= ticket->limit) {
    ++stats_.refused;
    return false;
  }
  ++in_flight_;
  peak_in_flight_ = std::max(peak_in_flight_, in_flight_);
  const bool uncrowded = in_flight_ <= options_.min_limit;
  if (!uncrowded) ++crowdings_;
  ticket->start = now;
  ticket->uncrowded = uncrowded;
  ticket->crowdings = crowdings_;
  return true;
}

void ConcurrencyLimit::Release(const Ticket& ticket, LatencySample sample) {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  if (in_flight_ == 0) CheckFailed("concurrency_limit", "Release without an Acquire");
  --in_flight_;
  if (sample != LatencySample::kNone) {
    // Not below zero: RealClock is the wall clock, which may step back.
    const absl::Duration latency = std::max(absl::ZeroDuration(), now - ticket.start);
    // An interval judges the calls it admitted: those from before the last update ran under
    // another limit (right after a shrink they would halve the new one again).
    if (!baseline_phase_ && ticket.start >= interval_start_ && samples_.size() < kMaxSamples) {
      samples_.push_back(latency);
    }
    if (sample == LatencySample::kFull && ticket.uncrowded && ticket.crowdings == crowdings_) {
      // A baseline from samples of one spell: those older than rebaseline_every are dropped.
      if (baseline_samples_.empty() || now - baseline_start_ > options_.rebaseline_every) {
        baseline_samples_.clear();
        baseline_start_ = now;
      }
      baseline_samples_.push_back(latency);
      if (baseline_samples_.size() >= options_.baseline_samples) {
        baseline_ = Percentile(baseline_samples_);
        baseline_samples_.clear();
        ++stats_.baselines;
        if (baseline_phase_ || stats_.baselines == 1) {
          baseline_phase_ = false;
          StartInterval(now);  // the samples before were judged against no baseline, or none
        }
      }
    }
  }
  Advance(now);
}

ConcurrencyLimitStats ConcurrencyLimit::Stats() const {
  absl::MutexLock lock(&mu_);
  ConcurrencyLimitStats s = stats_;
  s.limit = Allowed();
  s.in_flight = in_flight_;
  s.baseline = baseline_;
  s.measuring_baseline = baseline_phase_;
  return s;
}

}  // namespace hlem::router
