#pragma once
// Which embedding rows are hot right now: a Space-Saving summary (Metwally et al., 2005) of the
// (table, row) keys the node looks up, feeding refill (ARCHITECTURE §4: newly won EMB pages are
// filled with the rows most likely to be hit).
//
// The summary keeps at most `capacity` counters. A tracked key's counter grows by one per sampled
// access; an untracked key replaces the key with the smallest counter and inherits its count (the
// inherited part is the key's `error`, an upper bound on the overestimate). Any key accessed more
// than samples / capacity times is tracked, so TopK(k) for k well below capacity finds the heavy
// hitters. Counters sit in a min-heap with a position index: an update is O(log capacity).
//
// Cheap on the hot path: only about 1 in `sample_one_in` accesses touches the summary; the
// choice is a keyed hash of (seed, access number), deterministic for one thread and free of
// aliasing with periodic access patterns. Estimates are scaled back to accesses.
//
// Drift: every `decay_every_samples` sampled accesses every counter is multiplied by
// `decay_factor` (O(capacity), amortised O(1) when decay_every_samples >= capacity), so a new
// hot set overtakes an old one after a few periods.
//
// Thread-safe: Record* take one mutex per call (per batch for RecordBatch) only when sampled.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "serving_node/core/table_key.h"

namespace hlem::serving {

struct PopularityOptions {
  uint32_t capacity = 65536;         // counters kept; TopK is reliable for k well below it
  uint32_t sample_one_in = 1;        // 1: every access is counted
  uint64_t seed = 0x5eed;            // of the sampling hash
  uint64_t decay_every_samples = 0;  // 0: 8 * capacity
  double decay_factor = 0.5;         // in (0, 1]; 1 disables decay
};

struct PopularRow {
  uint32_t table_id = 0;
  uint64_t row = 0;
  double count = 0;  // estimated accesses (decayed), scaled by sample_one_in
  double error = 0;  // at most this much of `count` may be inherited from evicted keys
};

struct PopularityStats {
  uint64_t accesses = 0;  // Record calls, rows
  uint64_t samples = 0;   // of those, counted
  uint64_t replacements = 0;
  uint64_t decays = 0;
  uint32_t tracked = 0;  // now
};

class PopularitySketch {
 public:
  // INVALID_ARGUMENT (naming the field) for capacity 0, sample_one_in 0, or decay_factor outside
  // (0, 1].
  static absl::StatusOr<std::unique_ptr<PopularitySketch>> Create(const PopularityOptions& options);

  void Record(uint32_t table_id, uint64_t row);
  void RecordBatch(uint32_t table_id, std::span<const uint64_t> rows);

  // The min(k, tracked) keys with the largest estimated counts, largest first (ties by key).
  std::vector<PopularRow> TopK(uint32_t k) const;

  PopularityStats GetStats() const;

 private:
  struct Counter {
    uint32_t table_id;
    uint64_t row;
    double count;
    double error;
  };
  using Key = TableKey;

  explicit PopularitySketch(const PopularityOptions& options);
  bool Sampled();
  void CountLocked(uint32_t table_id, uint64_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SiftDownLocked(uint32_t pos) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SiftUpLocked(uint32_t pos) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SwapLocked(uint32_t a, uint32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PopularityOptions options_;
  const uint64_t decay_every_;
  std::atomic<uint64_t> accesses_{0};
  mutable absl::Mutex mu_;
  std::vector<Counter> heap_ ABSL_GUARDED_BY(mu_);               // min-heap by count
  absl::flat_hash_map<Key, uint32_t> pos_ ABSL_GUARDED_BY(mu_);  // key -> heap position
  uint64_t samples_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t since_decay_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t replacements_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t decays_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hlem::serving
