#include "serving_node/core/residency_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace hlem::serving {

absl::Status ResidencyState::Apply(const ResidencyEvent& event) {
  absl::MutexLock lock(&mu_);
  if (event.epoch != epoch_ || event.seq != seq_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat("residency event (", event.epoch, ", ",
                                                      event.seq, ") does not follow (", epoch_,
                                                      ", ", seq_, "); take a snapshot"));
  }
  seq_ = event.seq;
  using Kind = ResidencyEvent::Kind;
  switch (event.kind) {
    case Kind::kKvStored:
    case Kind::kKvTruncated:
      if (event.tokens > 0) {
        users_[event.user_id] = event.tokens;
      } else {
        users_.erase(event.user_id);
      }
      break;
    case Kind::kKvEvicted:
      users_.erase(event.user_id);
      break;
    case Kind::kEmbShardResident:
      shards_.insert({event.table_id, event.shard});
      break;
    case Kind::kEmbShardEvicted:
      shards_.erase(TableKey{event.table_id, event.shard});
      break;
    case Kind::kLoadReport:
      load_ = event.load;
      break;
  }
  return absl::OkStatus();
}

void ResidencyState::Reset(const ResidencySnapshot& snapshot) {
  absl::MutexLock lock(&mu_);
  epoch_ = snapshot.epoch;
  seq_ = snapshot.seq;
  users_.clear();
  for (const auto& [user, tokens] : snapshot.users) users_[user] = tokens;
  shards_.clear();
  for (const ResidentShard& s : snapshot.shards) shards_.insert({s.table_id, s.shard});
  load_ = snapshot.load;
}

ResidencySnapshot ResidencyState::Take() const {
  ResidencySnapshot out;
  absl::MutexLock lock(&mu_);
  out.epoch = epoch_;
  out.seq = seq_;
  out.users.assign(users_.begin(), users_.end());
  std::sort(out.users.begin(), out.users.end());
  for (const TableKey& k : shards_) out.shards.push_back({k.table_id, k.id});
  std::sort(out.shards.begin(), out.shards.end(),
            [](const ResidentShard& a, const ResidentShard& b) {
              return a.table_id != b.table_id ? a.table_id < b.table_id : a.shard < b.shard;
            });
  out.load = load_;
  return out;
}

uint64_t ResidencyState::seq() const {
  absl::MutexLock lock(&mu_);
  return seq_;
}

uint64_t ResidencyState::cached_tokens(uint64_t user) const {
  absl::MutexLock lock(&mu_);
  auto it = users_.find(user);
  return it == users_.end() ? 0 : it->second;
}

std::shared_ptr<ResidencyState> FollowResidency(ResidencyEventLog& log) {
  auto state = std::make_shared<ResidencyState>(log.epoch());
  // The log calls subscribers in seq order from the publishing thread; a gap cannot occur.
  log.Subscribe([state](const ResidencyEvent& e) { (void)state->Apply(e); });
  return state;
}

}  // namespace hlem::serving
