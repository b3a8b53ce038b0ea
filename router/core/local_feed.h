#pragma once
// A ResidencyFeed over a node in the same process: its ResidencyEventLog and ResidencyState
// directly, no RPC. The simulator and the cross-component tests subscribe the router's Cluster to
// in-process nodes with it; the ResidencySync loop on top is the one the router binary runs over
// gRPC, so gaps, replays and snapshots behave the same.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/core/residency_sync.h"
#include "serving_node/core/residency_events.h"
#include "serving_node/core/residency_state.h"

namespace hlem::router {

class LocalResidencyFeed final : public ResidencyFeed {
 public:
  // Borrows `log`; shares `state` (which must follow `log`). `poll` bounds how long a Stream waits
  // for new events before it checks for Cancel again (real time).
  LocalResidencyFeed(const serving::ResidencyEventLog& log,
                     std::shared_ptr<serving::ResidencyState> state,
                     absl::Duration poll = absl::Milliseconds(20))
      : log_(log), state_(std::move(state)), poll_(poll) {}

  // FAILED_PRECONDITION for another epoch or events the log no longer holds, OUT_OF_RANGE for a
  // seq in the future, CANCELLED after Cancel(); OK when on_batch returns false.
  absl::Status Stream(
      uint64_t epoch, uint64_t from_seq,
      const std::function<bool(uint64_t epoch, const std::vector<serving::ResidencyEvent>&)>&
          on_batch) override;
  absl::StatusOr<serving::ResidencySnapshot> Snapshot() override;
  // Sticky: every later Stream or Snapshot is CANCELLED.
  void Cancel() override { cancelled_ = true; }

 private:
  const serving::ResidencyEventLog& log_;
  const std::shared_ptr<serving::ResidencyState> state_;
  const absl::Duration poll_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace hlem::router
