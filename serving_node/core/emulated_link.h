#pragma once
// A host->device link with a configured bandwidth and per-transfer latency, driven by a Clock:
// the `cpu` device's PCIe stand-in, and the simulator's model of the real link. Transfers are
// served one at a time: critical ones first (FIFO among them), background ones only when no
// critical transfer is waiting; a transfer on the link is never preempted. A transfer of n bytes
// occupies the link for latency + n / bandwidth, back to back on the link's own time line (a late
// completion timer does not push the next transfer back). Thread-safe; completion callbacks run
// outside the lock, from the clock's timer thread (RealClock) or inside SimClock::Advance*.

#include <cstdint>
#include <deque>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "serving_node/core/device.h"

namespace hlem::serving {

struct LinkOptions {
  double bytes_per_second = 25e9;
  absl::Duration latency = absl::Microseconds(5);
};

class EmulatedLink {
 public:
  static absl::StatusOr<std::unique_ptr<EmulatedLink>> Create(const LinkOptions& options,
                                                              Clock& clock);
  ~EmulatedLink();

  // Queues a transfer; `done` runs when its last byte has crossed the link (on the clock's timer
  // thread, or inline in a simulated clock's advance). The destructor waits for a `done` that is
  // running, so `done` must not destroy the link.
  void Submit(CopyClass cls, uint64_t bytes, std::function<void()> done);
  bool critical_pending() const;
  absl::Duration TransferTime(uint64_t bytes) const;
  uint64_t busy_ns() const;  // total time the link carried transfers (for utilisation)

 private:
  struct Transfer {
    CopyClass cls;
    uint64_t bytes;
    absl::Time submitted;
    std::function<void()> done;
  };
  EmulatedLink(const LinkOptions& options, Clock& clock) : options_(options), clock_(clock) {}
  // Puts the next transfer on the idle link; returns false when nothing is queued.
  bool StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete();

  const LinkOptions options_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  std::deque<Transfer> queues_[2] ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  Transfer on_link_ ABSL_GUARDED_BY(mu_);
  uint64_t busy_ns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time free_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // the last transfer's end
  TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int completing_ ABSL_GUARDED_BY(mu_) = 0;  // completions running their `done` (unlocked)
};

}  // namespace hlem::serving
