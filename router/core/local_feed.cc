#include "router/core/local_feed.h"

#include "absl/strings/str_cat.h"

namespace hlem::router {

absl::Status LocalResidencyFeed::Stream(
    uint64_t epoch, uint64_t from_seq,
    const std::function<bool(uint64_t epoch, const std::vector<serving::ResidencyEvent>&)>&
        on_batch) {
  if (epoch != 0 && epoch != log_.epoch()) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch, " is not the node's (", log_.epoch(), ")"));
  }
  if (from_seq == 0) from_seq = 1;
  while (!cancelled_) {
    absl::StatusOr<std::vector<serving::ResidencyEvent>> events = log_.Since(from_seq);
    if (!events.ok()) return events.status();
    if (events->empty()) {
      log_.WaitPast(from_seq - 1, poll_);
      continue;
    }
    from_seq = events->back().seq + 1;
    if (!on_batch(log_.epoch(), *events)) return absl::OkStatus();
  }
  return absl::CancelledError("feed cancelled");
}

absl::StatusOr<serving::ResidencySnapshot> LocalResidencyFeed::Snapshot() {
  if (cancelled_) return absl::CancelledError("feed cancelled");
  return state_->Take();
}

}  // namespace hlem::router
