#pragma once
// The router's adaptive limit on calls in flight (issue 11, overload). A fixed limit
// (--max-in-flight) keeps the router's queue bounded, but what it costs in latency depends on the
// machine: by Little's law an admitted call waits limit ÷ throughput, so a limit that suits one
// cluster lets another's admitted calls wait 4× their unloaded latency at twice its capacity
// (docs/reliability.md, "Overload"). This limit follows the latency instead:
//
// - **Baseline**, the latency the cluster gives at low concurrency: the `percentile` of the
//   latencies of `baseline_samples` answered calls that ran uncrowded (at most `min_limit` calls
//   in flight from their start to their answer). Taken from the traffic as it comes, so that
//   while the router often has at most `min_limit` calls in flight it is re-measured all the
//   time without refusing anything (samples more than `rebaseline_every` apart make no
//   baseline). Until the first is measured the limit is `initial_limit`. Where the router is
//   busy (no call started with fewer than `min_limit` in flight) for `rebaseline_every`
//   (`first_baseline_within` before the first baseline: a router started into overload), the
//   limit drops to `min_limit` until `baseline_samples` have run uncrowded: that phase
//   refuses the calls beyond `min_limit`, for about baseline_samples ÷ min_limit latencies. A
//   router whose normal load keeps more than `min_limit` calls in flight pays it every
//   `rebaseline_every`: raise `min_limit` there.
// - **Tracking.** Then, once per `interval` with at least `min_samples` answers, the limit is
//   multiplied by target ÷ sample, where target = `tolerance` × baseline and sample is the
//   interval's latency at the same percentile, the factor kept within [0.5, 2] (and at least +1
//   when growing). The limit only grows when the interval's calls used at least half of it: a
//   quiet router keeps a limit near what it uses, so that a burst is held at once rather than
//   after the limit has come down from `max_limit`. It only shrinks when the calls in flight
//   reached it: below it, slow answers are not the router's doing (a slow spell of the machine,
//   a slow shard), and a lower limit would only refuse the next burst.
//
// A call is refused (Acquire false) when the calls in flight have reached the limit; the caller
// answers RESOURCE_EXHAUSTED. The caller says what each answer's latency is worth (Sample): an
// answer is a full sample; a call that ran out of time or waited out a node's queue says how
// loaded the cluster is but not what it gives unloaded (kLoad); a refusal or an invalid request
// says nothing (kNone).
//
// The same idea as Envoy's adaptive-concurrency gradient controller (a periodically re-measured
// low-concurrency latency, a multiplicative gradient); the growth rule is ours. No RPC; on the
// injected clock (updates happen in the calls, no timer); thread-safe.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace hlem::router {

struct ConcurrencyLimitOptions {
  uint32_t min_limit = 4;
  uint32_t max_limit = 256;
  uint32_t initial_limit = 16;  // the limit until the first baseline
  double tolerance = 2.0;       // the latency allowed, as a multiple of the baseline
  double percentile = 0.9;      // of the latencies, for the baseline and every interval
  absl::Duration interval = absl::Milliseconds(100);
  uint32_t min_samples = 20;  // per update; an interval with fewer lasts until it has them
  absl::Duration rebaseline_every = absl::Seconds(30);
  absl::Duration first_baseline_within = absl::Seconds(1);
  uint32_t baseline_samples = 50;
};

// What a call's latency is worth to the limit (Release).
enum class LatencySample {
  kNone,  // nothing: refused, invalid, a node's error
  kLoad,  // the interval's latency, not the baseline's: deadline exceeded, shed after queueing
  kFull,  // both: answered
};

struct ConcurrencyLimitStats {
  uint32_t limit = 0;  // now (min_limit while a baseline is measured)
  uint32_t in_flight = 0;
  absl::Duration baseline = absl::ZeroDuration();  // zero until the first is measured
  bool measuring_baseline = false;
  uint64_t refused = 0;
  uint64_t updates = 0, baselines = 0;  // limit updates and baselines measured
  uint64_t forced_baselines = 0;        // phases at min_limit (the router busy too long)
};

class ConcurrencyLimit {
 public:
  // What Acquire hands out; passed back to Release.
  struct Ticket {
    absl::Time start;
    bool uncrowded = false;  // at most min_limit in flight when it started
    uint64_t crowdings = 0;  // crowdings_ then
    // The limit Acquire applied, and the baseline then (zero until the first is measured): also
    // set when it refuses, for the caller's message.
    uint32_t limit = 0;
    absl::Duration baseline;
    bool measuring_baseline = false;
  };

  // INVALID_ARGUMENT naming the field: min_limit 0, max_limit < min_limit, initial_limit outside
  // [min_limit, max_limit], tolerance < 1 (or not finite), percentile outside (0, 1], interval,
  // rebaseline_every or first_baseline_within ≤ 0, min_samples or baseline_samples 0.
  static absl::Status Validate(const ConcurrencyLimitOptions& options);
  // `options` must be valid (Validate).
  ConcurrencyLimit(const ConcurrencyLimitOptions& options, Clock& clock);

  // True (and the call counts as in flight until Release) while below the limit.
  bool Acquire(Ticket* ticket);
  // The call has its answer; `sample`: what its latency (now − ticket.start) is worth. Once per
  // admitted call.
  void Release(const Ticket& ticket, LatencySample sample);

  ConcurrencyLimitStats Stats() const;

 private:
  // Applies what is due at `now`: an update of the limit, the start of a baseline.
  void Advance(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartInterval(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The options' percentile of `samples` (reordered; not empty).
  absl::Duration Percentile(std::vector<absl::Duration>& samples) const;
  uint32_t Allowed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ConcurrencyLimitOptions options_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  double limit_ ABSL_GUARDED_BY(mu_);                 // while tracking (kept across a baseline)
  bool baseline_phase_ ABSL_GUARDED_BY(mu_) = false;  // held at min_limit until measured
  absl::Duration baseline_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Time last_uncrowded_ ABSL_GUARDED_BY(mu_);  // the last call that started uncrowded
  absl::Time baseline_start_ ABSL_GUARDED_BY(mu_);  // the first of baseline_samples_
  absl::Time interval_start_ ABSL_GUARDED_BY(mu_);
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t peak_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // of the interval
  // Times the calls in flight went over min_limit: a call is uncrowded when it started at most
  // min_limit-th and this count did not move until its answer.
  uint64_t crowdings_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<absl::Duration> samples_ ABSL_GUARDED_BY(mu_);           // of the interval
  std::vector<absl::Duration> baseline_samples_ ABSL_GUARDED_BY(mu_);  // uncrowded ones
  ConcurrencyLimitStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::router
