#pragma once
// Compute units shared by processor sharing, on a Clock: the twin's model of the local machine's
// cores (every serving node's worker competes for them) or of one GPU. A job needs `work` of one
// unit's time; with k jobs active on u units each progresses at min(1, u ÷ k) of real time, so
// jobs that fit run at full speed and an oversubscribed machine slows everyone alike. Jobs that
// finish at the same instant complete in submission order (deterministic). Not thread-safe: the
// simulator is single-threaded.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"

namespace hlem::sim {

class SharedCompute {
 public:
  // `units` > 0.
  SharedCompute(Clock& clock, double units);
  ~SharedCompute();
  SharedCompute(const SharedCompute&) = delete;
  SharedCompute& operator=(const SharedCompute&) = delete;

  // Runs `done` when `work` of one unit's time has been served to this job.
  void Run(absl::Duration work, std::function<void()> done);

  size_t active() const { return jobs_.size(); }
  // Unit-time served so far (for utilisation = busy ÷ (units × elapsed)).
  absl::Duration busy() const;

 private:
  struct Job {
    double remaining_ns;
    uint64_t seq;
    std::function<void()> done;
  };
  // Serves the jobs for the time since the last update.
  void Advance();
  void Reschedule();
  void OnTimer();
  double Rate() const;

  Clock& clock_;
  const double units_;
  std::vector<Job> jobs_;  // in submission order
  absl::Time updated_;
  uint64_t next_seq_ = 0;
  double busy_ns_ = 0;
  TimerId timer_ = 0;
  bool timer_set_ = false;
};

}  // namespace hlem::sim
