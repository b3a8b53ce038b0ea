#pragma once
// Per-user shard profile Prof[u] (ARCHITECTURE §6): the K residency shards (table, row ÷
// residency_shard_rows) that a user's history touches most, with their counts. The router scores
// h_emb(n) = |Prof[u] ∩ EMBM[n]| ÷ |Prof[u]| with it.
//
// Built from a full history, or extended with the events of a delta request (Extend): the kept
// top-K counts grow with the new events and new shards compete with them; shards that fell out of
// the top K earlier are not remembered (a space-saving approximation: a shard's count may be
// under-estimated by what it had when it was dropped). Deterministic: ties break by (table, shard).

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "serving_node/core/table_key.h"

namespace hlem::router {

using ShardKey = serving::TableKey;  // (table id, residency shard id)

// One feature of an event: its table, the table's residency shard size and its rows (valid ids
// are [0, rows); the largest uint64 when not known, e.g. in the simulator).
struct FeatureShards {
  uint32_t table_id = 0;
  uint64_t residency_shard_rows = 4096;
  uint64_t rows = std::numeric_limits<uint64_t>::max();
};

struct ProfileEntry {
  ShardKey shard;
  uint32_t count = 0;
};

class ShardProfile {
 public:
  ShardProfile() = default;
  // From a history: feature ids event-major (event j's feature f at ids[j·F + f]).
  static ShardProfile Build(std::span<const uint64_t> ids, std::span<const FeatureShards> features,
                            uint32_t k);
  // A profile with these entries (most counted first), e.g. a cached compact one expanded.
  static ShardProfile FromEntries(std::vector<ProfileEntry> entries);
  // The top K of counts made elsewhere (the simulator's sketched histories); a shard listed twice
  // counts their sum.
  static ShardProfile TopOf(std::span<const ProfileEntry> counts, uint32_t k);
  // Adds the events of `ids` (same layout) and keeps the top K.
  void Extend(std::span<const uint64_t> ids, std::span<const FeatureShards> features, uint32_t k);

  const std::vector<ProfileEntry>& entries() const { return entries_; }  // most counted first
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

 private:
  std::vector<ProfileEntry> entries_;
};

}  // namespace hlem::router
