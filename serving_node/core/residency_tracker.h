#pragma once
// Decides which residency shards (ARCHITECTURE §7: runs of `residency_shard_rows` consecutive
// rows of a table) this node holds, and publishes the changes as residency events for the router.
//
// A shard is resident when the EMB cache holds at least `threshold` (default ½) of the shard's
// rows that the node looked up in the last `windows` (default 12) decision windows. The
// looked-up side is exact: every distinct (table, row) looked up is remembered with the last
// window it was seen in, and per-shard counts are kept per window slot. The held side uses
// EmbCache::ResidentRows, i.e. all committed rows of the shard, looked up recently or not (rows
// brought in by refill count too; they are there because they are popular).
//
// Record() is called with every deduplicated lookup batch; CloseWindow() once per window (it
// evaluates the shards seen in the horizon, publishes kEmbShardResident / kEmbShardEvicted for
// the ones that changed, and forgets rows older than the horizon). Thread-safe.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/residency_events.h"
#include "serving_node/core/table_key.h"

namespace hlem::serving {

struct ResidencyTrackerOptions {
  uint64_t residency_shard_rows = 4096;  // must equal the EMB cache's
  uint32_t windows = 12;
  double threshold = 0.5;
};

struct ResidentShard {
  uint32_t table_id = 0;
  uint64_t shard = 0;
  bool operator==(const ResidentShard&) const = default;
};

class ResidencyTracker {
 public:
  // INVALID_ARGUMENT for zero shard rows or windows, or a threshold outside (0, 1].
  static absl::StatusOr<std::unique_ptr<ResidencyTracker>> Create(
      const ResidencyTrackerOptions& options, EmbCache& cache, ResidencyEventLog* events);

  void Record(uint32_t table_id, std::span<const uint64_t> rows);
  // Ends the current window: re-evaluates, publishes changes, returns how many shards changed.
  uint32_t CloseWindow();

  // Distinct rows of the shard looked up in the horizon (current window included).
  uint64_t LookedUpRows(uint32_t table_id, uint64_t shard) const;
  std::vector<ResidentShard> ResidentShards() const;  // as of the last CloseWindow

 private:
  using ShardKey = TableKey;  // (table, residency shard)
  using RowKey = TableKey;    // (table, row)
  struct ShardState {
    std::vector<uint32_t> per_window;  // distinct rows last seen in each window slot
    uint64_t total = 0;                // sum of per_window
    bool resident = false;
  };

  ResidencyTracker(const ResidencyTrackerOptions& options, EmbCache& cache,
                   ResidencyEventLog* events)
      : options_(options), cache_(cache), events_(events) {}

  const ResidencyTrackerOptions options_;
  EmbCache& cache_;
  ResidencyEventLog* events_;
  mutable absl::Mutex mu_;
  uint64_t window_ ABSL_GUARDED_BY(mu_) = 0;                              // current window number
  absl::flat_hash_map<RowKey, uint64_t> last_seen_ ABSL_GUARDED_BY(mu_);  // row -> window
  absl::flat_hash_map<ShardKey, ShardState> shards_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::serving
