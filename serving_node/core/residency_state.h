#pragma once
// The residency state that a node's event stream describes (ARCHITECTURE §6): users with cached
// K/V and their token counts, resident residency shards, and the last load report, as of the last
// applied (epoch, seq). The node keeps one fed by its event log to answer Snapshot; a subscriber
// (the router) keeps one per node and applies the streamed events. Thread-safe.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "serving_node/core/residency_events.h"
#include "serving_node/core/residency_tracker.h"
#include "serving_node/core/table_key.h"

namespace hlem::serving {

struct ResidencySnapshot {
  uint64_t epoch = 0;
  uint64_t seq = 0;                                  // last event reflected
  std::vector<std::pair<uint64_t, uint64_t>> users;  // (user, cached tokens), ascending user
  std::vector<ResidentShard> shards;                 // ascending (table, shard)
  ResidencyEvent::Load load;                         // last load report
};

class ResidencyState {
 public:
  explicit ResidencyState(uint64_t epoch) : epoch_(epoch) {}
  // Applies the next event. FAILED_PRECONDITION (nothing changes) when it belongs to another
  // epoch or its seq is not last seq + 1: the subscriber has a gap and needs a snapshot.
  absl::Status Apply(const ResidencyEvent& event);
  // Replaces the whole state (a subscriber resynchronising from a snapshot).
  void Reset(const ResidencySnapshot& snapshot);
  ResidencySnapshot Take() const;
  uint64_t seq() const;
  uint64_t cached_tokens(uint64_t user) const;  // 0 when not resident

 private:
  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, uint64_t> users_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<TableKey> shards_ ABSL_GUARDED_BY(mu_);
  ResidencyEvent::Load load_ ABSL_GUARDED_BY(mu_);
};

// A ResidencyState that follows `log` from its first event (create it before anything publishes).
// The subscription keeps the state alive as long as the log.
std::shared_ptr<ResidencyState> FollowResidency(ResidencyEventLog& log);

}  // namespace hlem::serving
