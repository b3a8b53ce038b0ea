#include "common/clock.h"

#include <algorithm>

namespace hlem {

TimerId TimerQueue::Push(absl::Time when, std::function<void()> fn) {
  uint64_t seq = next_seq_++;
  TimerId id = seq + 1;
  heap_.push_back(Entry{when, seq, id, std::move(fn)});
  std::push_heap(heap_.begin(), heap_.end(), Later());
  live_ids_.insert(id);
  return id;
}

bool TimerQueue::Cancel(TimerId id) {
  if (live_ids_.erase(id) == 0) return false;
  CompactIfSparse();
  return true;
}

// Cancelled timeouts far in the future would otherwise pile up in the heap until their time comes.
void TimerQueue::CompactIfSparse() {
  if (heap_.size() < 64 || heap_.size() < 2 * live_ids_.size()) return;
  std::erase_if(heap_, [this](const Entry& e) { return !live_ids_.contains(e.id); });
  std::make_heap(heap_.begin(), heap_.end(), Later());
}

void TimerQueue::DropCancelledTop() {
  while (!heap_.empty() && !live_ids_.contains(heap_.front().id)) {
    std::pop_heap(heap_.begin(), heap_.end(), Later());
    heap_.pop_back();
  }
}

bool TimerQueue::PopDue(absl::Time limit, Entry* out) {
  DropCancelledTop();
  if (heap_.empty() || heap_.front().when > limit) return false;
  std::pop_heap(heap_.begin(), heap_.end(), Later());
  *out = std::move(heap_.back());
  heap_.pop_back();
  live_ids_.erase(out->id);
  return true;
}

absl::Time TimerQueue::NextTime() {
  DropCancelledTop();
  return heap_.empty() ? absl::InfiniteFuture() : heap_.front().when;
}

RealClock& RealClock::Get() {
  static RealClock* clock = new RealClock();  // never destroyed: timers may run at exit
  return *clock;
}

RealClock::~RealClock() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

TimerId RealClock::ScheduleAt(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { TimerLoop(); });
  ++pushes_;
  return timers_.Push(when, std::move(fn));
}

bool RealClock::Cancel(TimerId id) {
  absl::MutexLock lock(&mu_);
  return timers_.Cancel(id);
}

TimerStats RealClock::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void RealClock::SleepUntil(absl::Time when) {
  absl::Duration d = when - absl::Now();
  if (d > absl::ZeroDuration()) absl::SleepFor(d);
}

void RealClock::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    TimerQueue::Entry due;
    const absl::Time now = absl::Now();
    if (timers_.PopDue(now, &due)) {
      mu_.Unlock();
      due.fn();
      due.fn = nullptr;  // its captures go now, outside the lock ScheduleAt and Cancel take
      const absl::Time end = absl::Now();
      mu_.Lock();
      const uint64_t lag =
          static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Nanoseconds(now - due.when)));
      const uint64_t busy =
          static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Nanoseconds(end - now)));
      ++stats_.timers;
      stats_.late_1ms += lag >= 1'000'000 ? 1 : 0;
      stats_.late_10ms += lag >= 10'000'000 ? 1 : 0;
      stats_.lag_ns += lag;
      stats_.max_lag_ns = std::max(stats_.max_lag_ns, lag);
      stats_.busy_ns += busy;
      stats_.max_callback_ns = std::max(stats_.max_callback_ns, busy);
      continue;
    }
    // Wake up at the next timer, when a new (possibly earlier) timer is pushed, or on stop.
    absl::Time next = timers_.NextTime();
    uint64_t before = pushes_;
    auto changed = [this, before]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || pushes_ != before; };
    mu_.AwaitWithDeadline(absl::Condition(&changed), next);
  }
}

absl::Time SimClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

TimerId SimClock::ScheduleAt(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  return timers_.Push(std::max(when, now_), std::move(fn));
}

bool SimClock::Cancel(TimerId id) {
  absl::MutexLock lock(&mu_);
  return timers_.Cancel(id);
}

void SimClock::AdvanceTo(absl::Time when) {
  mu_.Lock();
  TimerQueue::Entry due;
  while (timers_.PopDue(when, &due)) {
    now_ = std::max(now_, due.when);
    mu_.Unlock();
    due.fn();
    due.fn = nullptr;  // its captures go now, outside the lock
    mu_.Lock();
  }
  now_ = std::max(now_, when);
  mu_.Unlock();
}

bool SimClock::RunNext() {
  mu_.Lock();
  TimerQueue::Entry due;
  if (!timers_.PopDue(absl::InfiniteFuture(), &due)) {
    mu_.Unlock();
    return false;
  }
  now_ = std::max(now_, due.when);
  mu_.Unlock();
  due.fn();
  return true;
}

size_t SimClock::pending() const {
  absl::MutexLock lock(&mu_);
  return timers_.size();
}

absl::Time SimClock::NextTime() {
  absl::MutexLock lock(&mu_);
  return timers_.NextTime();
}

}  // namespace hlem
