#pragma once
// Residency events of one serving node incarnation (ARCHITECTURE §4, §6): every KV store/evict of
// a user and every change of a residency shard's state, numbered (epoch, seq) so the router can
// apply them in order, detect gaps and ask for a replay. seq starts at 1 and has no gaps within an
// epoch. The log keeps the last `capacity` events for replay. Thread-safe.

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hlem::serving {

struct ResidencyEvent {
  enum class Kind : uint8_t {
    kKvStored,          // user's KV now holds `tokens` cached tokens (new or grown)
    kKvEvicted,         // user's KV was dropped entirely
    kKvTruncated,       // user's KV lost tail pages; `tokens` is what remains
    kEmbShardResident,  // residency shard (table_id, shard) became resident
    kEmbShardEvicted,   // ... stopped being resident
    kLoadReport,        // the node's load (periodic, also a heartbeat, or on a material change)
  };
  // Why a user's KV shrank or went (kKvEvicted, kKvTruncated).
  enum class Cause : uint8_t {
    kUnspecified,
    kLru,       // the KV budget was full
    kAlpha,     // pages reclaimed for the EMB side (α grew)
    kMismatch,  // the history no longer matched the cached tokens
    kExplicit,  // an operator or test evicted it
  };
  struct Load {
    double load = 0;
    uint32_t queue_depth = 0;
    uint64_t in_flight_tokens = 0;
    bool draining = false;
    double alpha_effective = 0;
  };
  uint64_t epoch = 0;
  uint64_t seq = 0;
  Kind kind = Kind::kKvStored;
  uint64_t user_id = 0;               // KV events
  uint64_t tokens = 0;                // KV events
  uint32_t table_id = 0;              // EMB events
  uint64_t shard = 0;                 // EMB events: residency shard id (row / residency_shard_rows)
  Cause cause = Cause::kUnspecified;  // kKvEvicted, kKvTruncated
  Load load;                          // kLoadReport
};

class ResidencyEventLog {
 public:
  ResidencyEventLog(uint64_t epoch, size_t capacity) : epoch_(epoch), capacity_(capacity) {}

  // Stamps (epoch, next seq), appends, notifies subscribers (outside the lock).
  uint64_t Publish(ResidencyEvent event);
  // Events with seq >= from_seq, oldest first; OUT_OF_RANGE when from_seq is in the future,
  // FAILED_PRECONDITION when some of them were already dropped (the caller needs a snapshot).
  absl::StatusOr<std::vector<ResidencyEvent>> Since(uint64_t from_seq) const;
  uint64_t epoch() const { return epoch_; }
  uint64_t last_seq() const;
  // Called for every published event, in seq order, from the publishing thread.
  void Subscribe(std::function<void(const ResidencyEvent&)> fn);
  // Blocks until an event with seq > `seq` exists or `timeout` passes (real time); true if one
  // does.
  bool WaitPast(uint64_t seq, absl::Duration timeout) const;

 private:
  const uint64_t epoch_;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<ResidencyEvent> log_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::function<void(const ResidencyEvent&)>> subscribers_ ABSL_GUARDED_BY(mu_);
  absl::Mutex publish_mu_;  // keeps subscriber calls in seq order
};

}  // namespace hlem::serving
