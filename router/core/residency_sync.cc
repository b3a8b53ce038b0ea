#include "router/core/residency_sync.h"

namespace hlem::router {

void ResidencySync::Step() {
  bool snapshot, failed;
  uint64_t epoch, from;
  {
    absl::MutexLock lock(&mu_);
    snapshot = need_snapshot_;
    epoch = epoch_;
    from = next_seq_;
    failed = failed_;
    failed_ = false;
  }
  if (failed) clock_.SleepFor(backoff_);
  if (stopping_) return;
  if (snapshot) {
    absl::StatusOr<serving::ResidencySnapshot> s = feed_.Snapshot();
    absl::MutexLock lock(&mu_);
    // Stop() ended it: the node is being dropped. A cancel from the node's side is a failure.
    if (absl::IsCancelled(s.status()) && stopping_) return;
    if (!s.ok()) {
      cluster_.SetUnreachable(node_);
      ++stats_.failures;
      failed_ = true;
      return;
    }
    cluster_.Reset(node_, *s);
    ++stats_.snapshots;
    need_snapshot_ = false;
    epoch_ = s->epoch;
    next_seq_ = s->seq + 1;
    return;
  }
  bool gap = false, resync = false;
  uint64_t next = from, applied = 0;
  const absl::Status st =
      feed_.Stream(epoch, from, [&](uint64_t, const std::vector<serving::ResidencyEvent>& events) {
        for (const serving::ResidencyEvent& e : events) {
          const absl::Status a = cluster_.Apply(node_, e);
          if (a.ok()) {
            if (e.seq >= next) next = e.seq + 1;
            ++applied;
            continue;
          }
          if (a.code() == absl::StatusCode::kFailedPrecondition && e.epoch == epoch) {
            gap = true;  // replay from `next`
          } else {
            resync = true;  // a new epoch, or a filter that needs rebuilding
            if (a.code() == absl::StatusCode::kResourceExhausted) next = e.seq + 1;
          }
          return false;
        }
        return !stopping_;
      });
  absl::MutexLock lock(&mu_);
  ++stats_.streams;
  stats_.events += applied;
  next_seq_ = next;
  if (resync) {
    need_snapshot_ = true;
  } else if (gap) {
    ++stats_.replays;
  } else if (!st.ok()) {
    const absl::StatusCode code = st.code();
    if (code == absl::StatusCode::kFailedPrecondition || code == absl::StatusCode::kOutOfRange) {
      need_snapshot_ = true;  // the node no longer retains those events, or restarted
    } else if (code != absl::StatusCode::kCancelled || !stopping_) {
      cluster_.SetUnreachable(node_);
      need_snapshot_ = true;
      failed_ = true;
      ++stats_.failures;
    }
  }
}

void ResidencySync::Run() {
  while (!stopping_) Step();
}

void ResidencySync::Stop() {
  stopping_ = true;
  feed_.Cancel();
}

ResidencySyncStats ResidencySync::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace hlem::router
