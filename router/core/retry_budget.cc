#include "router/core/retry_budget.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"

namespace hlem::router {

absl::Status RetryBudget::Validate(const RetryBudgetOptions& options) {
  if (!(options.ratio >= 0) || !std::isfinite(options.ratio)) {
    return absl::InvalidArgumentError("retry_budget.ratio: must be a number ≥ 0");
  }
  if (!(options.min_per_second >= 0) || !std::isfinite(options.min_per_second)) {
    return absl::InvalidArgumentError("retry_budget.min_per_second: must be a number ≥ 0");
  }
  if (options.window <= absl::ZeroDuration() || options.window == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("retry_budget.window: must be > 0 and finite");
  }
  return absl::OkStatus();
}

RetryBudget::RetryBudget(const RetryBudgetOptions& options, Clock& clock)
    : options_(options),
      bucket_(std::max(absl::Nanoseconds(1), options.window / kBuckets)),
      clock_(clock) {}

RetryBudget::Bucket& RetryBudget::Current() {
  absl::Duration rest;
  const int64_t slice = absl::IDivDuration(clock_.Now() - absl::UnixEpoch(), bucket_, &rest);
  Bucket& b = buckets_[static_cast<size_t>(((slice % kBuckets) + kBuckets) % kBuckets)];
  if (b.slice != slice) b = Bucket{.slice = slice};  // a slice that left the window: reuse
  return b;
}

void RetryBudget::OnRequest() {
  absl::MutexLock lock(&mu_);
  ++Current().requests;
  ++stats_.requests;
}

bool RetryBudget::TryRetry() {
  absl::MutexLock lock(&mu_);
  Bucket& now = Current();
  uint64_t requests = 0, retries = 0;
  for (const Bucket& b : buckets_) {
    if (b.slice > now.slice - kBuckets) {  // within the window (stale slices count nothing)
      requests += b.requests;
      retries += b.retries;
    }
  }
  const double allowed = options_.min_per_second * absl::ToDoubleSeconds(options_.window) +
                         options_.ratio * static_cast<double>(requests);
  if (static_cast<double>(retries) + 1 > allowed) {
    ++stats_.over_budget;
    return false;
  }
  ++now.retries;
  ++stats_.retries;
  return true;
}

RetryBudgetStats RetryBudget::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace hlem::router
