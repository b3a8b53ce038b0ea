#include "serving_node/core/emulated_link.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<EmulatedLink>> EmulatedLink::Create(const LinkOptions& options,
                                                                   Clock& clock) {
  if (!(options.bytes_per_second > 0) || !std::isfinite(options.bytes_per_second)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link.bytes_per_second: must be a positive number, got ", options.bytes_per_second));
  }
  if (options.latency < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("link.latency: must be >= 0");
  }
  return std::unique_ptr<EmulatedLink>(new EmulatedLink(options, clock));
}

EmulatedLink::~EmulatedLink() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  // A completion already running on the timer thread finishes before we go, its `done` included:
  // the owner's state it touches (the device's pool, a cache it commits to) goes after us.
  if (busy_ && clock_.Cancel(timer_)) busy_ = false;
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_ && completing_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

absl::Duration EmulatedLink::TransferTime(uint64_t bytes) const {
  return options_.latency +
         absl::Nanoseconds(std::ceil(static_cast<double>(bytes) * 1e9 / options_.bytes_per_second));
}

void EmulatedLink::Submit(CopyClass cls, uint64_t bytes, std::function<void()> done) {
  absl::MutexLock lock(&mu_);
  queues_[static_cast<int>(cls)].push_back(Transfer{cls, bytes, clock_.Now(), std::move(done)});
  if (!busy_) StartNextLocked();
}

bool EmulatedLink::StartNextLocked() {
  if (stopping_) return false;
  for (int c = 0; c < 2; ++c) {
    if (queues_[c].empty()) continue;
    on_link_ = std::move(queues_[c].front());
    queues_[c].pop_front();
    busy_ = true;
    absl::Duration t = TransferTime(on_link_.bytes);
    busy_ns_ += static_cast<uint64_t>(absl::ToInt64Nanoseconds(t));
    // A transfer starts when it was submitted or when the previous one ended on the link's own
    // time line, not when that one's completion timer happened to run: a late wake-up (≈ 0.1 ms
    // on a RealClock) then delays one answer instead of adding itself to every queued transfer.
    const absl::Time begin = std::max(on_link_.submitted, free_at_);
    free_at_ = begin + t;
    timer_ = clock_.ScheduleAt(free_at_, [this] { Complete(); });
    return true;
  }
  return false;
}

void EmulatedLink::Complete() {
  std::function<void()> done;
  {
    absl::MutexLock lock(&mu_);
    done = std::move(on_link_.done);
    busy_ = false;
    ++completing_;
    StartNextLocked();
  }
  if (done) {
    done();
    done = nullptr;  // its captures go before the destructor may return
  }
  absl::MutexLock lock(&mu_);
  --completing_;
}

bool EmulatedLink::critical_pending() const {
  absl::MutexLock lock(&mu_);
  return !queues_[0].empty() || (busy_ && on_link_.cls == CopyClass::kCritical);
}

uint64_t EmulatedLink::busy_ns() const {
  absl::MutexLock lock(&mu_);
  return busy_ns_;
}

}  // namespace hlem::serving
