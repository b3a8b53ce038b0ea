#include "serving_node/core/residency_tracker.h"

#include "absl/strings/str_cat.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<ResidencyTracker>> ResidencyTracker::Create(
    const ResidencyTrackerOptions& options, EmbCache& cache, ResidencyEventLog* events) {
  if (options.residency_shard_rows == 0) {
    return absl::InvalidArgumentError("residency.shard_rows: must be > 0");
  }
  if (options.windows == 0) return absl::InvalidArgumentError("residency.windows: must be > 0");
  if (!(options.threshold > 0 && options.threshold <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("residency.threshold: must be in (0, 1], got ", options.threshold));
  }
  return std::unique_ptr<ResidencyTracker>(new ResidencyTracker(options, cache, events));
}

void ResidencyTracker::Record(uint32_t table_id, std::span<const uint64_t> rows) {
  absl::MutexLock lock(&mu_);
  const uint32_t slot = static_cast<uint32_t>(window_ % options_.windows);
  for (uint64_t row : rows) {
    auto [it, fresh] = last_seen_.try_emplace(RowKey{table_id, row}, window_);
    const ShardKey key{table_id, row / options_.residency_shard_rows};
    if (!fresh) {
      const uint64_t before = it->second;
      if (before == window_) continue;  // already counted in this window
      it->second = window_;
      if (window_ - before < options_.windows) {  // still counted in an older slot: move it
        ShardState& s = shards_[key];
        if (!s.per_window.empty()) {
          --s.per_window[before % options_.windows];
          --s.total;
        }
      }
    }
    ShardState& s = shards_[key];
    if (s.per_window.empty()) s.per_window.assign(options_.windows, 0);
    ++s.per_window[slot];
    ++s.total;
  }
}

uint32_t ResidencyTracker::CloseWindow() {
  std::vector<ResidencyEvent> changes;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = shards_.begin(); it != shards_.end();) {
      ShardState& s = it->second;
      const uint64_t held = cache_.ResidentRows(it->first.table_id, it->first.id);
      const bool resident =
          s.total > 0 && static_cast<double>(held) >= options_.threshold * s.total;
      if (resident != s.resident) {
        s.resident = resident;
        ResidencyEvent e;
        e.kind = resident ? ResidencyEvent::Kind::kEmbShardResident
                          : ResidencyEvent::Kind::kEmbShardEvicted;
        e.table_id = it->first.table_id;
        e.shard = it->first.id;
        changes.push_back(e);
      }
      ++it;
    }
    // Advance: the slot the next window reuses drops out of the horizon.
    ++window_;
    const uint32_t slot = static_cast<uint32_t>(window_ % options_.windows);
    for (auto it = shards_.begin(); it != shards_.end();) {
      ShardState& s = it->second;
      s.total -= s.per_window[slot];
      s.per_window[slot] = 0;
      if (s.total == 0 && !s.resident) {
        shards_.erase(it++);
      } else {
        ++it;
      }
    }
    if (window_ >= options_.windows) {
      const uint64_t oldest = window_ - options_.windows + 1;
      for (auto it = last_seen_.begin(); it != last_seen_.end();) {
        if (it->second < oldest) {
          last_seen_.erase(it++);
        } else {
          ++it;
        }
      }
    }
  }
  if (events_ != nullptr) {
    for (const ResidencyEvent& e : changes) events_->Publish(e);
  }
  return static_cast<uint32_t>(changes.size());
}

uint64_t ResidencyTracker::LookedUpRows(uint32_t table_id, uint64_t shard) const {
  absl::MutexLock lock(&mu_);
  auto it = shards_.find(ShardKey{table_id, shard});
  return it == shards_.end() ? 0 : it->second.total;
}

std::vector<ResidentShard> ResidencyTracker::ResidentShards() const {
  absl::MutexLock lock(&mu_);
  std::vector<ResidentShard> out;
  for (const auto& [key, s] : shards_) {
    if (s.resident) out.push_back(ResidentShard{key.table_id, key.id});
  }
  return out;
}

}  // namespace hlem::serving
