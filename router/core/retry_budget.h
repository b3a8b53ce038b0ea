#pragma once
// The router's retry budget. A request that a node refused at admission or could not take
// (router::RetryElsewhere) gets one retry on another node; under overload every node refuses,
// and unbounded retries would double the work the cluster is already shedding. The budget keeps
// the retries of the last `window` within `ratio` of the requests of that window, plus a floor
// of `min_per_second` so that a quiet router still retries a node that just went down. A retry
// over the budget is not sent: the request is answered with its first attempt's error.
//
// Counted over `kBuckets` slices of the window on the injected clock; thread-safe.

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace hlem::router {

struct RetryBudgetOptions {
  double ratio = 0.2;          // retries per request over the window
  double min_per_second = 10;  // retries always allowed at this rate
  absl::Duration window = absl::Seconds(10);
};

struct RetryBudgetStats {
  uint64_t requests = 0;     // OnRequest calls
  uint64_t retries = 0;      // TryRetry calls answered true
  uint64_t over_budget = 0;  // TryRetry calls answered false
};

class RetryBudget {
 public:
  static constexpr int kBuckets = 10;

  // INVALID_ARGUMENT naming the field: ratio < 0, min_per_second < 0, window ≤ 0.
  static absl::Status Validate(const RetryBudgetOptions& options);
  // `options` must be valid (Validate).
  RetryBudget(const RetryBudgetOptions& options, Clock& clock);

  // A request came in (each request once, whatever its attempts).
  void OnRequest();
  // A retry wants to go: true (and counted) while within the budget.
  bool TryRetry();

  RetryBudgetStats Stats() const;

 private:
  struct Bucket {
    int64_t slice = -1;  // which slice of time it counts (now ÷ bucket length)
    uint64_t requests = 0, retries = 0;
  };
  Bucket& Current() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RetryBudgetOptions options_;
  const absl::Duration bucket_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  std::array<Bucket, kBuckets> buckets_ ABSL_GUARDED_BY(mu_);
  RetryBudgetStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::router
