#include "serving_node/core/residency_events.h"

#include <cstddef>

#include "absl/strings/str_cat.h"

namespace hlem::serving {

uint64_t ResidencyEventLog::Publish(ResidencyEvent event) {
  absl::MutexLock order(&publish_mu_);
  std::vector<std::function<void(const ResidencyEvent&)>> subscribers;
  {
    absl::MutexLock lock(&mu_);
    event.epoch = epoch_;
    event.seq = next_seq_++;
    log_.push_back(event);
    while (log_.size() > capacity_) log_.pop_front();
    subscribers = subscribers_;
  }
  for (const auto& fn : subscribers) fn(event);
  return event.seq;
}

absl::StatusOr<std::vector<ResidencyEvent>> ResidencyEventLog::Since(uint64_t from_seq) const {
  absl::MutexLock lock(&mu_);
  if (from_seq > next_seq_) {
    return absl::OutOfRangeError(
        absl::StrCat("from_seq ", from_seq, " is past the last event ", next_seq_ - 1));
  }
  uint64_t oldest = log_.empty() ? next_seq_ : log_.front().seq;
  if (from_seq < oldest && from_seq != 0) {
    return absl::FailedPreconditionError(absl::StrCat("events from seq ", from_seq,
                                                      " were dropped (oldest kept: ", oldest,
                                                      "); take a snapshot"));
  }
  // Seqs in the log are consecutive: start at from_seq's position instead of scanning.
  const size_t first = from_seq <= oldest ? 0 : static_cast<size_t>(from_seq - oldest);
  return std::vector<ResidencyEvent>(log_.begin() + static_cast<std::ptrdiff_t>(first), log_.end());
}

uint64_t ResidencyEventLog::last_seq() const {
  absl::MutexLock lock(&mu_);
  return next_seq_ - 1;
}

bool ResidencyEventLog::WaitPast(uint64_t seq, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto past = [this, seq]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return next_seq_ > seq + 1; };
  return mu_.AwaitWithTimeout(absl::Condition(&past), timeout);
}

void ResidencyEventLog::Subscribe(std::function<void(const ResidencyEvent&)> fn) {
  absl::MutexLock lock(&mu_);
  subscribers_.push_back(std::move(fn));
}

}  // namespace hlem::serving
