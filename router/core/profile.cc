#include "router/core/profile.h"

#include <algorithm>
#include <array>
#include <bit>

#include "absl/container/flat_hash_map.h"
#include "common/rng.h"

namespace hlem::router {
namespace {

// Per-shard counts of one feature, in a small open-addressing table that is merged into the
// caller's map when it fills and at the end: a history's ids fall in tens to hundreds of shards,
// and a probe of this table costs a fraction of a hash-map update (bench/router_benchmark,
// BM_ProfileBuild; docs/perf/router.md).
class ShardTally {
 public:
  ShardTally(uint32_t table_id, absl::flat_hash_map<ShardKey, uint32_t>* counts)
      : table_id_(table_id), counts_(counts) {}
  ~ShardTally() { Flush(); }
  void Add(uint64_t shard, uint32_t n) {
    size_t i = Mix64(shard) >> (64 - kBits);
    while (slots_[i].count != 0 && slots_[i].shard != shard) i = (i + 1) & (kSlots - 1);
    if (slots_[i].count == 0) {
      slots_[i].shard = shard;
      if (++used_ == kSlots / 2) {  // keep probes short: merge and start again
        slots_[i].count = n;
        Flush();
        return;
      }
    }
    slots_[i].count += n;
  }

 private:
  static constexpr int kBits = 10;
  static constexpr size_t kSlots = size_t{1} << kBits;
  struct Slot {
    uint64_t shard = 0;
    uint32_t count = 0;  // 0: empty
  };
  void Flush() {
    if (used_ == 0) return;
    for (Slot& s : slots_) {
      if (s.count == 0) continue;
      (*counts_)[ShardKey{table_id_, s.shard}] += s.count;
      s = Slot{};
    }
    used_ = 0;
  }
  uint32_t table_id_;
  absl::flat_hash_map<ShardKey, uint32_t>* counts_;
  std::array<Slot, kSlots> slots_{};
  size_t used_ = 0;
};

void Count(std::span<const uint64_t> ids, std::span<const FeatureShards> features,
           absl::flat_hash_map<ShardKey, uint32_t>* counts) {
  const size_t F = features.size();
  if (F == 0) return;
  // A user's events come from a few communities, so a feature's consecutive rows often share a
  // shard: each feature's current run is counted once, when it ends.
  for (size_t g = 0; g < F; ++g) {
    const FeatureShards& f = features[g];
    const uint64_t rows = std::max<uint64_t>(1, f.residency_shard_rows);
    // Shard sizes are powers of two in every profile: a shift, not a 64-bit division per id.
    const bool pow2 = (rows & (rows - 1)) == 0;
    const int shift = std::countr_zero(rows);
    ShardTally tally(f.table_id, counts);
    uint64_t shard = 0;
    uint32_t run = 0;
    for (size_t i = g; i < ids.size(); i += F) {
      const uint64_t s = pow2 ? ids[i] >> shift : ids[i] / rows;
      if (run > 0 && s != shard) {
        tally.Add(shard, run);
        run = 0;
      }
      shard = s;
      ++run;
    }
    if (run > 0) tally.Add(shard, run);
  }
}

std::vector<ProfileEntry> TopK(const absl::flat_hash_map<ShardKey, uint32_t>& counts, uint32_t k) {
  std::vector<ProfileEntry> all;
  all.reserve(counts.size());
  for (const auto& [shard, count] : counts) all.push_back({shard, count});
  auto better = [](const ProfileEntry& a, const ProfileEntry& b) {
    if (a.count != b.count) return a.count > b.count;
    if (a.shard.table_id != b.shard.table_id) return a.shard.table_id < b.shard.table_id;
    return a.shard.id < b.shard.id;
  };
  if (all.size() > k) {
    std::nth_element(all.begin(), all.begin() + k, all.end(), better);
    all.resize(k);
  }
  std::sort(all.begin(), all.end(), better);
  return all;
}

}  // namespace

ShardProfile ShardProfile::Build(std::span<const uint64_t> ids,
                                 std::span<const FeatureShards> features, uint32_t k) {
  absl::flat_hash_map<ShardKey, uint32_t> counts;
  Count(ids, features, &counts);
  ShardProfile p;
  p.entries_ = TopK(counts, k);
  return p;
}

ShardProfile ShardProfile::TopOf(std::span<const ProfileEntry> counts, uint32_t k) {
  absl::flat_hash_map<ShardKey, uint32_t> merged;
  for (const ProfileEntry& e : counts) {
    if (e.count > 0) merged[e.shard] += e.count;
  }
  ShardProfile p;
  p.entries_ = TopK(merged, k);
  return p;
}

ShardProfile ShardProfile::FromEntries(std::vector<ProfileEntry> entries) {
  ShardProfile p;
  p.entries_ = std::move(entries);
  return p;
}

void ShardProfile::Extend(std::span<const uint64_t> ids, std::span<const FeatureShards> features,
                          uint32_t k) {
  absl::flat_hash_map<ShardKey, uint32_t> counts;
  for (const ProfileEntry& e : entries_) counts[e.shard] = e.count;
  Count(ids, features, &counts);
  entries_ = TopK(counts, k);
}

}  // namespace hlem::router
