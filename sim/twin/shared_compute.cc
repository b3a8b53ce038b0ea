#include "sim/twin/shared_compute.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace hlem::sim {

SharedCompute::SharedCompute(Clock& clock, double units)
    : clock_(clock), units_(units), updated_(clock.Now()) {
  if (!(units > 0)) {
    std::fprintf(stderr, "SharedCompute: units must be > 0, got %g\n", units);
    std::abort();
  }
}

SharedCompute::~SharedCompute() {
  if (timer_set_) clock_.Cancel(timer_);
}

double SharedCompute::Rate() const {
  return jobs_.empty() ? 0.0 : std::min(1.0, units_ / static_cast<double>(jobs_.size()));
}

absl::Duration SharedCompute::busy() const { return absl::Nanoseconds(busy_ns_); }

void SharedCompute::Advance() {
  const absl::Time now = clock_.Now();
  const double elapsed = absl::ToDoubleNanoseconds(now - updated_);
  updated_ = now;
  if (elapsed <= 0 || jobs_.empty()) return;
  const double served = elapsed * Rate();
  for (Job& j : jobs_) j.remaining_ns -= served;
  busy_ns_ += served * static_cast<double>(jobs_.size());
}

void SharedCompute::Run(absl::Duration work, std::function<void()> done) {
  Advance();
  jobs_.push_back({std::max(0.0, absl::ToDoubleNanoseconds(work)), next_seq_++, std::move(done)});
  Reschedule();
}

void SharedCompute::Reschedule() {
  if (timer_set_) {
    clock_.Cancel(timer_);
    timer_set_ = false;
  }
  if (jobs_.empty()) return;
  double least = jobs_.front().remaining_ns;
  for (const Job& j : jobs_) least = std::min(least, j.remaining_ns);
  // Whole nanoseconds, rounded up, so a job is never finished early.
  const double wait = std::max(0.0, std::ceil(least / Rate()));
  timer_ = clock_.ScheduleAt(updated_ + absl::Nanoseconds(static_cast<int64_t>(wait)),
                             [this] { OnTimer(); });
  timer_set_ = true;
}

void SharedCompute::OnTimer() {
  timer_set_ = false;
  Advance();
  // Every job within half a nanosecond of done finishes now, in submission order.
  std::vector<std::function<void()>> finished;
  auto it = std::stable_partition(jobs_.begin(), jobs_.end(),
                                  [](const Job& j) { return j.remaining_ns > 0.5; });
  for (auto f = it; f != jobs_.end(); ++f) finished.push_back(std::move(f->done));
  jobs_.erase(it, jobs_.end());
  Reschedule();
  for (auto& fn : finished) fn();
}

}  // namespace hlem::sim
