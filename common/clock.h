#pragma once
// Time as a dependency. Everything that needs "now", a timer or a sleep takes a Clock&, so the
// same code runs on the wall clock in the services and on a simulated clock in the simulator and
// in deterministic tests. RealClock is the only singleton; SimClock is owned by its test or sim.
// Both implementations are thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hlem {

using TimerId = uint64_t;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Runs `fn` once at or after `when` (on the clock's timer thread for RealClock, inside
  // Advance*/RunNext for SimClock). Returns an id for Cancel.
  virtual TimerId ScheduleAt(absl::Time when, std::function<void()> fn) = 0;
  TimerId ScheduleAfter(absl::Duration delay, std::function<void()> fn) {
    return ScheduleAt(Now() + delay, std::move(fn));
  }
  // Returns true when the timer had not run yet and now never will.
  virtual bool Cancel(TimerId id) = 0;
  // Blocks the caller until Now() >= when (SimClock: advances time, running due timers).
  virtual void SleepUntil(absl::Time when) = 0;
  void SleepFor(absl::Duration d) { SleepUntil(Now() + d); }
};

// Timers due at the same instant run in the order they were scheduled (deterministic).
// Not thread-safe: the clocks guard it with their mutex.
class TimerQueue {
 public:
  struct Entry {
    absl::Time when;
    uint64_t seq;
    TimerId id;
    std::function<void()> fn;
  };
  TimerId Push(absl::Time when, std::function<void()> fn);
  bool Cancel(TimerId id);
  // Pops the earliest live timer due at or before `limit`; false if none.
  bool PopDue(absl::Time limit, Entry* out);
  // Earliest live timer time, or InfiniteFuture.
  absl::Time NextTime();
  size_t size() const { return live_ids_.size(); }

 private:
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.when != b.when ? a.when > b.when : a.seq > b.seq;
    }
  };
  void DropCancelledTop();
  void CompactIfSparse();
  std::vector<Entry> heap_;                // a binary heap ordered by Later; may hold cancelled
                                           // entries, dropped lazily or by CompactIfSparse()
  absl::flat_hash_set<TimerId> live_ids_;  // scheduled, neither run nor cancelled
  uint64_t next_seq_ = 0;
};

// How punctual a RealClock's timer thread is. One timer that runs long delays every timer due
// behind it (they share the thread), so a long callback shows up as other timers' lag.
struct TimerStats {
  uint64_t timers = 0;           // timers run
  uint64_t late_1ms = 0;         // run at least 1 ms after their time
  uint64_t late_10ms = 0;        // ... at least 10 ms after
  uint64_t lag_ns = 0;           // total lag (time run − time due)
  uint64_t max_lag_ns = 0;       // the largest lag
  uint64_t busy_ns = 0;          // total time inside callbacks
  uint64_t max_callback_ns = 0;  // the longest callback
};

// The wall clock. Timers run on one background thread, started lazily. A component whose timers
// may block (a fetch over the network) gets its own RealClock, so that it never delays the timers
// of the critical path (the serving node's link completions: serving_node/main.cc).
class RealClock final : public Clock {
 public:
  static RealClock& Get();
  RealClock() = default;
  ~RealClock() override;
  absl::Time Now() const override { return absl::Now(); }
  TimerId ScheduleAt(absl::Time when, std::function<void()> fn) override;
  bool Cancel(TimerId id) override;
  void SleepUntil(absl::Time when) override;
  TimerStats Stats() const;

 private:
  void TimerLoop();
  mutable absl::Mutex mu_;
  TimerQueue timers_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;  // wakes the timer thread on every new timer
  TimerStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // started on first ScheduleAt
};

// Simulated time: starts at `start` and moves only when told to. Timers run on the thread that
// advances the clock, in (time, scheduling order). SleepUntil from the advancing thread advances
// time itself, which is what a single-threaded simulation wants.
class SimClock final : public Clock {
 public:
  explicit SimClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override;
  TimerId ScheduleAt(absl::Time when, std::function<void()> fn) override;
  bool Cancel(TimerId id) override;
  void SleepUntil(absl::Time when) override { AdvanceTo(when); }

  // Runs every timer due up to `when` (including ones they schedule), then sets Now() = when.
  void AdvanceTo(absl::Time when);
  void AdvanceBy(absl::Duration d) { AdvanceTo(Now() + d); }
  // Jumps to the next timer and runs it; false when no timer is pending.
  bool RunNext();
  size_t pending() const;
  // When the next pending timer is due; InfiniteFuture when none is.
  absl::Time NextTime();

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  TimerQueue timers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem
