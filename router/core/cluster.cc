#include "router/core/cluster.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/shed.h"

namespace hlem::router {

using serving::ResidencyEvent;

const char* NodeViewName(NodeView view) {
  switch (view) {
    case NodeView::kExact:
      return "exact";
    case NodeView::kDegraded:
      return "degraded";
    case NodeView::kUnreachable:
      return "unreachable";
  }
  return "unknown";
}

struct Cluster::Node {
  Node(std::string id_in, std::string address_in, size_t kv_capacity)
      : id(std::move(id_in)), address(std::move(address_in)), key(NameHash(id)), kv(kv_capacity) {}
  std::string id, address;
  uint64_t key;  // user-hash routing
  NodeView view = NodeView::kDegraded;
  uint64_t epoch = 0, seq = 0;
  bool awaiting_replay = false;  // degraded by a gap: the next in-order event makes it exact
  KvFilter kv;
  uint64_t shards = 0;
  double reported_load = 1;
  absl::Time report_time = absl::InfinitePast();
  bool draining = false;
  uint32_t in_flight = 0;
  uint32_t in_flight_at_report = 0;  // the router's in-flight requests when the report arrived
  uint64_t dispatches = 0;
  uint64_t generation = 0;  // unique per AddNode: tells this node from a later one in its slot
};

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(const ClusterOptions& options,
                                                         Clock& clock) {
  absl::StatusOr<Weights> w = NormalisedWeights(options.scorer);
  if (!w.ok()) return w.status();
  if (!(options.scorer.tau >= 0 && options.scorer.tau <= 1)) {
    return absl::InvalidArgumentError("router.tau: must be in [0, 1]");
  }
  if (!(options.scorer.epsilon >= 0 && std::isfinite(options.scorer.epsilon))) {
    return absl::InvalidArgumentError("router.epsilon: must be >= 0");
  }
  if (options.max_nodes == 0) return absl::InvalidArgumentError("router.max_nodes: 0");
  if (options.profile_top_k == 0) return absl::InvalidArgumentError("router.profile_top_k: 0");
  if (options.features.empty()) return absl::InvalidArgumentError("router.features: none");
  for (const FeatureShards& f : options.features) {
    if (f.residency_shard_rows == 0) {
      return absl::InvalidArgumentError("router.features: residency_shard_rows 0");
    }
    if (f.rows == 0) return absl::InvalidArgumentError("router.features: rows 0");
  }
  if (!(options.kv_filter_headroom >= 1)) {
    return absl::InvalidArgumentError("router.kv_filter_headroom: must be >= 1");
  }
  if (!(options.in_flight_capacity > 0)) {
    return absl::InvalidArgumentError("router.in_flight_capacity: must be > 0");
  }
  if (options.kv_filter_capacity == 0 || options.user_cache_capacity == 0) {
    return absl::InvalidArgumentError("router: kv_filter_capacity and user_cache_capacity > 0");
  }
  return std::unique_ptr<Cluster>(new Cluster(options, *w, clock));
}

Cluster::Cluster(const ClusterOptions& options, const Weights& weights, Clock& clock)
    : options_(options),
      words_((options.max_nodes + 63) / 64),
      clock_(clock),
      weights_(weights),
      rng_(options.seed) {}

Cluster::~Cluster() = default;

absl::StatusOr<int> Cluster::AddNode(const std::string& id, const std::string& address) {
  absl::MutexLock lock(&mu_);
  int free = -1;
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    if (nodes_[i] == nullptr) {
      if (free < 0) free = i;
    } else if (nodes_[i]->id == id) {
      return absl::AlreadyExistsError(absl::StrCat("node ", id, " is already known"));
    }
  }
  if (free < 0) {
    if (nodes_.size() >= options_.max_nodes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("router: more than max_nodes ", options_.max_nodes, " nodes"));
    }
    free = static_cast<int>(nodes_.size());
    nodes_.emplace_back();
    emb_counts_.resize(nodes_.size());
  }
  nodes_[free] = std::make_unique<Node>(id, address, options_.kv_filter_capacity);
  nodes_[free]->generation = next_generation_++;
  return free;
}

Weights Cluster::weights() const {
  absl::MutexLock lock(&mu_);
  return weights_;
}

absl::Status Cluster::SetWeights(const Weights& w) {
  for (double v : {w.kv, w.emb, w.load}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError("weights must be finite and non-negative");
    }
  }
  if (std::abs(w.kv + w.emb + w.load - 1) > 1e-9) {
    return absl::InvalidArgumentError("weights must sum to 1");
  }
  absl::MutexLock lock(&mu_);
  weights_ = w;
  return absl::OkStatus();
}

void Cluster::RemoveNode(int node) {
  absl::MutexLock lock(&mu_);
  if (node < 0 || node >= static_cast<int>(nodes_.size()) || nodes_[node] == nullptr) return;
  DropNodeStateLocked(node);
  nodes_[node].reset();
  for (auto& [user, entry] : users_) {
    if (entry.affinity == node) entry.affinity = -1;
  }
}

int Cluster::FindNode(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    if (nodes_[i] != nullptr && nodes_[i]->id == id) return i;
  }
  return -1;
}

void Cluster::DropNodeStateLocked(int node) {
  Node& n = *nodes_[node];
  n.kv.Clear();
  for (auto& [user, entry] : users_) {
    if (entry.speculative_node == node) entry.speculative_node = -1;
  }
  // The node's bit in every shard of the reverse map.
  const size_t word = static_cast<size_t>(node) / 64;
  const uint64_t bit = uint64_t{1} << (node % 64);
  for (uint32_t id = 0; id < shard_key_.size(); ++id) {
    uint64_t& w = bits_[id * words_ + word];
    if ((w & bit) == 0) continue;
    w &= ~bit;
    MaybeFreeLocked(id);
  }
  n.shards = 0;
}

uint32_t Cluster::InternLocked(ShardKey shard) {
  auto [it, fresh] = shard_id_.try_emplace(shard, 0);
  if (!fresh) return it->second;
  uint32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
    shard_key_[id] = shard;
    refs_[id] = 0;
  } else {
    id = static_cast<uint32_t>(shard_key_.size());
    shard_key_.push_back(shard);
    refs_.push_back(0);
    bits_.resize(bits_.size() + words_, 0);
  }
  it->second = id;
  return id;
}

void Cluster::MaybeFreeLocked(uint32_t id) {
  if (refs_[id] != 0) return;
  for (size_t k = 0; k < words_; ++k) {
    if (bits_[id * words_ + k] != 0) return;
  }
  shard_id_.erase(shard_key_[id]);
  free_ids_.push_back(id);
}

void Cluster::SetShardLocked(int node, ShardKey shard, bool resident) {
  Node& n = *nodes_[node];
  const size_t word = static_cast<size_t>(node) / 64;
  const uint64_t bit = uint64_t{1} << (node % 64);
  if (resident) {
    uint64_t& w = bits_[InternLocked(shard) * words_ + word];
    if ((w & bit) == 0) ++n.shards;
    w |= bit;
    return;
  }
  auto it = shard_id_.find(shard);
  if (it == shard_id_.end()) return;
  uint64_t& w = bits_[it->second * words_ + word];
  if ((w & bit) == 0) return;
  w &= ~bit;
  --n.shards;
  MaybeFreeLocked(it->second);
}

void Cluster::SetProfileLocked(UserEntry& entry, const ShardProfile& profile) {
  std::vector<CompactEntry> next;
  next.reserve(profile.size());
  for (const ProfileEntry& e : profile.entries()) {
    const uint32_t id = InternLocked(e.shard);
    ++refs_[id];
    next.push_back({id, static_cast<uint16_t>(std::min<uint32_t>(e.count, UINT16_MAX))});
  }
  for (const CompactEntry& e : entry.profile) {
    --refs_[e.shard];
    MaybeFreeLocked(e.shard);
  }
  entry.profile = std::move(next);
}

absl::Status Cluster::Apply(int node, const ResidencyEvent& e) {
  absl::MutexLock lock(&mu_);
  if (node < 0 || node >= static_cast<int>(nodes_.size()) || nodes_[node] == nullptr) {
    return absl::NotFoundError(absl::StrCat("router: no node ", node));
  }
  Node& n = *nodes_[node];
  if (e.epoch != n.epoch) {
    ++stats_.epoch_resets;
    n.view = NodeView::kDegraded;
    n.awaiting_replay = false;
    return absl::FailedPreconditionError(absl::StrCat("node ", n.id, ": event of epoch ", e.epoch,
                                                      ", view of epoch ", n.epoch,
                                                      "; take a snapshot"));
  }
  if (e.seq <= n.seq) {
    ++stats_.events_ignored;  // a replay overlapping what was applied
    return absl::OkStatus();
  }
  if (e.seq != n.seq + 1) {
    ++stats_.gaps;
    if (n.view == NodeView::kExact) n.awaiting_replay = true;
    n.view = NodeView::kDegraded;
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", n.id, ": event seq ", e.seq, " after ", n.seq, "; replay from ", n.seq + 1));
  }
  n.seq = e.seq;
  ++stats_.events_applied;
  if (n.awaiting_replay) {  // the replay closed the gap
    n.awaiting_replay = false;
    n.view = NodeView::kExact;
  }
  switch (e.kind) {
    case ResidencyEvent::Kind::kKvStored:
      ForgetSpeculativeLocked(node, e.user_id);
      if (!n.kv.Insert(e.user_id)) {
        ++stats_.filter_full;
        n.view = NodeView::kDegraded;  // a snapshot rebuilds a larger filter
        n.awaiting_replay = false;
        return absl::ResourceExhaustedError(
            absl::StrCat("node ", n.id, ": KV filter full at ", n.kv.size(), " users"));
      }
      break;
    case ResidencyEvent::Kind::kKvTruncated:
      if (e.tokens > 0) break;  // still resident, shorter
      [[fallthrough]];
    case ResidencyEvent::Kind::kKvEvicted:
      ForgetSpeculativeLocked(node, e.user_id);
      n.kv.Erase(e.user_id);
      break;
    case ResidencyEvent::Kind::kEmbShardResident:
      SetShardLocked(node, ShardKey{e.table_id, e.shard}, true);
      break;
    case ResidencyEvent::Kind::kEmbShardEvicted:
      SetShardLocked(node, ShardKey{e.table_id, e.shard}, false);
      break;
    case ResidencyEvent::Kind::kLoadReport:
      n.reported_load = std::clamp(e.load.load, 0.0, 1.0);
      n.draining = e.load.draining;
      n.report_time = clock_.Now();
      n.in_flight_at_report = n.in_flight;
      break;
  }
  return absl::OkStatus();
}

void Cluster::Reset(int node, const serving::ResidencySnapshot& s) {
  absl::MutexLock lock(&mu_);
  if (node < 0 || node >= static_cast<int>(nodes_.size()) || nodes_[node] == nullptr) return;
  ++stats_.snapshots;
  DropNodeStateLocked(node);
  Node& n = *nodes_[node];
  // Room for the users the node holds now with headroom (and at least the configured capacity).
  n.kv = KvFilter(std::max(
      options_.kv_filter_capacity,
      static_cast<size_t>(options_.kv_filter_headroom * static_cast<double>(s.users.size()))));
  bool full = false;
  for (const auto& [user, tokens] : s.users) full |= !n.kv.Insert(user);
  for (const serving::ResidentShard& shard : s.shards) {
    SetShardLocked(node, ShardKey{shard.table_id, shard.shard}, true);
  }
  n.epoch = s.epoch;
  n.seq = s.seq;
  n.reported_load = std::clamp(s.load.load, 0.0, 1.0);
  n.draining = s.load.draining;
  n.report_time = clock_.Now();
  n.in_flight_at_report = n.in_flight;
  n.view = full ? NodeView::kDegraded : NodeView::kExact;
  n.awaiting_replay = false;
  if (full) ++stats_.filter_full;
}

void Cluster::SetUnreachable(int node) {
  absl::MutexLock lock(&mu_);
  if (node < 0 || node >= static_cast<int>(nodes_.size()) || nodes_[node] == nullptr) return;
  nodes_[node]->view = NodeView::kUnreachable;
}

double Cluster::LoadLocked(const Node& n, absl::Time stale_before) const {
  if (n.view != NodeView::kExact || n.draining || n.report_time < stale_before) return 1.0;
  // The report counts what was in flight then; requests the router added since and still has in
  // flight come on top.
  const uint32_t added =
      n.in_flight > n.in_flight_at_report ? n.in_flight - n.in_flight_at_report : 0;
  return std::min(1.0, n.reported_load + added / options_.in_flight_capacity);
}

void Cluster::ForgetSpeculativeLocked(int node, uint64_t user) {
  auto it = users_.find(user);
  if (it != users_.end() && it->second.speculative_node == node) it->second.speculative_node = -1;
}

RouteResult Cluster::Route(uint64_t user, std::span<const uint64_t> history, bool delta,
                           std::span<const int> exclude) {
  // The profile outside the lock (a 15 000-event history is the expensive part); a delta request
  // extends the cached one.
  // A delta request without new events keeps the cached profile as it is.
  const bool keep_profile = delta && history.empty();
  ShardProfile profile;
  if (delta && !keep_profile) {
    absl::MutexLock lock(&mu_);
    auto it = users_.find(user);
    if (it != users_.end()) {
      std::vector<ProfileEntry> cached;
      for (const CompactEntry& e : it->second.profile) {
        cached.push_back({shard_key_[e.shard], e.count});
      }
      profile = ShardProfile::FromEntries(std::move(cached));
    }
  }
  if (delta && !keep_profile) {
    profile.Extend(history, options_.features, options_.profile_top_k);
  } else if (!delta) {
    profile = ShardProfile::Build(history, options_.features, options_.profile_top_k);
  }
  absl::MutexLock lock(&mu_);
  return RouteLocked(user, profile, keep_profile, exclude);
}

RouteResult Cluster::RouteWithProfile(uint64_t user, const ShardProfile& profile,
                                      std::span<const int> exclude) {
  absl::MutexLock lock(&mu_);
  return RouteLocked(user, profile, /*keep_profile=*/false, exclude);
}

RouteResult Cluster::RouteLocked(uint64_t user, const ShardProfile& profile, bool keep_profile,
                                 std::span<const int> exclude) {
  const absl::Time now = clock_.Now();
  UserEntry& entry = users_[user];
  if (!keep_profile) SetProfileLocked(entry, profile);
  entry.last_use = ++use_clock_;
  // The speculative belief (the user's last dispatch, unconfirmed) while its TTL runs.
  const int speculative =
      entry.speculative_node >= 0 && entry.speculative_expiry > now ? entry.speculative_node : -1;
  // h_emb: per profile shard, the nodes holding it.
  std::fill(emb_counts_.begin(), emb_counts_.end(), 0);
  uint64_t total = 0;  // the profile's weight: shards, or their events
  for (const CompactEntry& p : entry.profile) {
    const uint32_t weight = options_.h_emb_by_events ? p.count : 1;
    total += weight;
    for (size_t k = 0; k < words_; ++k) {
      for (uint64_t w = bits_[p.shard * words_ + k]; w != 0; w &= w - 1) {
        const size_t node = k * 64 + static_cast<size_t>(std::countr_zero(w));
        if (node < emb_counts_.size()) emb_counts_[node] += weight;
      }
    }
  }
  const double profile_size = static_cast<double>(std::max<uint64_t>(1, total));
  const KvFilter::Probe probe = KvFilter::ProbeOf(user);
  const absl::Time stale_before = now - options_.max_report_age;
  signals_.clear();
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    Node* n = nodes_[i].get();
    if (n == nullptr || n->view == NodeView::kUnreachable) continue;
    if (std::find(exclude.begin(), exclude.end(), i) != exclude.end()) continue;
    signals_.push_back({.node = i,
                        .h_kv = i == speculative || n->kv.Contains(probe) ? 1.0 : 0.0,
                        .h_emb = emb_counts_[static_cast<size_t>(i)] / profile_size,
                        .load = LoadLocked(*n, stale_before),
                        .key = n->key});
  }
  RouteResult result;
  result.routable_nodes = static_cast<uint32_t>(signals_.size());
  result.decision = options_.policy == PolicyKind::kHlem
                        ? ScoreRoute(signals_, entry.affinity, weights_, options_.scorer, rng_)
                        : PolicyRoute(options_.policy, signals_, user, &round_robin_, rng_);
  if (result.decision.node >= 0) {
    Node& n = *nodes_[result.decision.node];
    result.node_id = n.id;
    result.node_generation = n.generation;
    entry.affinity = result.decision.node;
    ++n.in_flight;
    ++n.dispatches;
    if (!n.kv.Contains(user)) {
      entry.speculative_node = result.decision.node;
      entry.speculative_expiry = now + options_.speculative_ttl;
    }
  }
  if (users_.size() > options_.user_cache_capacity) TrimUsersLocked();
  return result;
}

void Cluster::TrimUsersLocked() {
  // Drop the least recently used eighth: amortised O(1) per request.
  std::vector<uint64_t> uses;
  uses.reserve(users_.size());
  for (const auto& [user, e] : users_) uses.push_back(e.last_use);
  const size_t drop = std::max<size_t>(1, users_.size() / 8);
  std::nth_element(uses.begin(), uses.begin() + static_cast<std::ptrdiff_t>(drop - 1), uses.end());
  const uint64_t cutoff = uses[drop - 1];
  for (auto& [user, e] : users_) {
    if (e.last_use <= cutoff) SetProfileLocked(e, ShardProfile());
  }
  absl::erase_if(users_, [cutoff](const auto& e) { return e.second.last_use <= cutoff; });
}

void Cluster::Completed(int node, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (node < 0 || node >= static_cast<int>(nodes_.size()) || nodes_[node] == nullptr) return;
  Node& n = *nodes_[node];
  if (generation != 0 && n.generation != generation) return;  // the node it meant has left
  if (n.in_flight > 0) --n.in_flight;
  if (n.in_flight_at_report > n.in_flight) n.in_flight_at_report = n.in_flight;
}

void Cluster::Forget(int node, uint64_t user, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  if (node < 0 || node >= static_cast<int>(nodes_.size()) || nodes_[node] == nullptr) return;
  if (generation != 0 && nodes_[node]->generation != generation) return;
  ForgetSpeculativeLocked(node, user);
}

std::vector<NodeStatus> Cluster::Nodes() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_.Now();
  std::vector<NodeStatus> out;
  for (int i = 0; i < static_cast<int>(nodes_.size()); ++i) {
    const Node* n = nodes_[i].get();
    if (n == nullptr) continue;
    uint64_t speculative = 0;
    for (const auto& [user, e] : users_) {
      speculative += e.speculative_node == i && e.speculative_expiry > now;
    }
    out.push_back({.index = i,
                   .id = n->id,
                   .address = n->address,
                   .view = n->view,
                   .epoch = n->epoch,
                   .last_seq = n->seq,
                   .load = LoadLocked(*n, now - options_.max_report_age),
                   .reported_load = n->reported_load,
                   .report_age = now - n->report_time,
                   .in_flight = n->in_flight,
                   .draining = n->draining,
                   .resident_users = n->kv.size(),
                   .speculative_users = speculative,
                   .resident_shards = n->shards,
                   .dispatches = n->dispatches});
  }
  return out;
}

ClusterStats Cluster::Stats() const {
  absl::MutexLock lock(&mu_);
  ClusterStats s = stats_;
  s.cached_profiles = users_.size();
  // Memory held by the index: slots as allocated (hash tables: capacity × slot + control bytes).
  auto table = [](size_t capacity, size_t slot) { return capacity * (slot + 1); };
  uint64_t bytes = 0;
  for (const auto& n : nodes_) {
    if (n == nullptr) continue;
    bytes += n->kv.bytes();
  }
  bytes += table(shard_id_.capacity(), sizeof(std::pair<ShardKey, uint32_t>));
  bytes += shard_key_.capacity() * sizeof(ShardKey) + refs_.capacity() * sizeof(uint32_t) +
           bits_.capacity() * sizeof(uint64_t) + free_ids_.capacity() * sizeof(uint32_t);
  for (const auto& [user, e] : users_) bytes += e.profile.capacity() * sizeof(CompactEntry);
  bytes += table(users_.capacity(), sizeof(std::pair<uint64_t, UserEntry>));
  s.index_bytes = bytes;
  return s;
}

bool RetryElsewhere(const absl::Status& failed) {
  switch (failed.code()) {
    case absl::StatusCode::kUnavailable:
      return true;
    case absl::StatusCode::kResourceExhausted:
      return !IsShedLate(failed);
    default:
      return false;
  }
}

}  // namespace hlem::router
