#pragma once
// The router's view of the serving nodes (ARCHITECTURE §6) and the routing decision over it,
// without RPC: the router service feeds it the nodes' residency streams and calls Route per
// request; the simulator and the tests drive it on a SimClock.
//
// Per node: KVM[n] (a KvFilter of users whose K/V the node reported stored, plus the speculative
// belief written at dispatch — kept per user, for the user's last dispatch — that counts as
// resident until `speculative_ttl` passes or an event confirms or removes it), EMBM[n] (resident
// residency shards, kept as a reverse map shard → node bitset so h_emb of every node costs |Prof|
// lookups), the view state (exact / degraded / unreachable), the last load report and the router's
// own dispatches since it.
//
// Load: l(n) = min(1, reported load + (requests the router has in flight to the node beyond those
// it had when the report came) ÷ in_flight_capacity), so a burst between two reports does not herd
// onto one node and answered requests stop counting at once; 1 when the last report is older than
// `max_report_age`, when the node drains, or while the view is degraded (saturated: routable only
// when every node is). Unreachable nodes receive nothing.
//
// Per user: Prof[u] (top-K residency shards, profile.h), Aff[u] (the last node chosen) and the
// speculative entry, in a bounded cache (least recently used users are dropped).
//
// Residency protocol: Apply() takes one event of a node's stream and checks (epoch, seq): the
// next seq of the current epoch is applied; an older seq is ignored (a replay overlap); a gap or a
// new epoch returns FAILED_PRECONDITION and marks the view degraded: the caller replays from
// last_seq + 1 or resets from a snapshot (Reset), which also sizes the node's filter for its users.
// Thread-safe (one mutex; Route holds it for O(nodes + |Prof|·nodes/64)).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rng.h"
#include "router/core/kv_filter.h"
#include "router/core/policy.h"
#include "router/core/profile.h"
#include "serving_node/core/residency_events.h"
#include "serving_node/core/residency_state.h"

namespace hlem::router {

enum class NodeView : uint8_t { kExact, kDegraded, kUnreachable };
const char* NodeViewName(NodeView view);

struct ClusterOptions {
  PolicyKind policy = PolicyKind::kHlem;
  ScorerOptions scorer;
  uint32_t max_nodes = 256;
  uint32_t profile_top_k = 20;
  std::vector<FeatureShards> features;  // of the model's feature tables, in feature_ids order
  absl::Duration speculative_ttl = absl::Seconds(2);
  absl::Duration max_report_age = absl::Seconds(3);
  double in_flight_capacity = 64;    // router requests in flight that make a node fully loaded
  size_t kv_filter_capacity = 8192;  // users per node until a snapshot says more
  double kv_filter_headroom = 1.25;  // a snapshot sizes the filter for this × its users
  size_t user_cache_capacity = 1 << 17;
  uint64_t seed = 1;  // tie-breaking
  // h_emb = |Prof ∩ EMBM| ÷ |Prof| (the paper's, false), or the share of the profile's events
  // whose shard the node holds (true): a user's traffic is skewed towards its top shards, and the
  // weighted form predicts the node's EMB hit rate a little better (docs/perf/router.md).
  bool h_emb_by_events = false;
};

// What one Route saw and chose.
struct RouteResult {
  Decision decision;
  std::string node_id;  // empty when no node was chosen
  // The chosen node's incarnation in its slot: passed back to Completed and Forget, so an answer
  // arriving after the node left and another took its index touches nothing of the newcomer.
  uint64_t node_generation = 0;
  uint32_t routable_nodes = 0;
};

// The router's per-node state, for GetRoutingState and metrics.
struct NodeStatus {
  int index = -1;
  std::string id, address;
  NodeView view = NodeView::kDegraded;
  uint64_t epoch = 0, last_seq = 0;
  double load = 1, reported_load = 1;
  absl::Duration report_age = absl::InfiniteDuration();
  uint32_t in_flight = 0;
  bool draining = false;
  uint64_t resident_users = 0, speculative_users = 0, resident_shards = 0, dispatches = 0;
};

struct ClusterStats {
  uint64_t events_applied = 0, events_ignored = 0, gaps = 0, epoch_resets = 0, snapshots = 0;
  uint64_t filter_full = 0;  // stored users the filter could not hold (the view went degraded)
  uint64_t cached_profiles = 0;
  uint64_t index_bytes = 0;  // KV filters + speculative entries + EMB reverse map + user cache
};

class Cluster {
 public:
  // INVALID_ARGUMENT naming the field for bad options (weights, τ, ε, zero sizes, no features).
  static absl::StatusOr<std::unique_ptr<Cluster>> Create(const ClusterOptions& options,
                                                         Clock& clock);
  ~Cluster();

  // Membership. AddNode returns the node's index (stable until RemoveNode); ALREADY_EXISTS for a
  // known id, RESOURCE_EXHAUSTED beyond max_nodes. A new node is degraded until its first Reset.
  absl::StatusOr<int> AddNode(const std::string& id, const std::string& address);
  void RemoveNode(int node);
  int FindNode(const std::string& id) const;  // -1 when unknown

  // Residency stream (see the class comment).
  absl::Status Apply(int node, const serving::ResidencyEvent& event);
  void Reset(int node, const serving::ResidencySnapshot& snapshot);
  void SetUnreachable(int node);

  // Chooses a node for the user and records the dispatch (speculative KV entry, affinity,
  // in-flight). `history` is the request's feature ids (event-major): the whole history, or with
  // `delta` only the new events (the cached profile is extended). `exclude` lists node indices not
  // to choose (a retry). Call Completed(node) when the node answered.
  RouteResult Route(uint64_t user, std::span<const uint64_t> history, bool delta,
                    std::span<const int> exclude = {});
  // As Route for a whole history whose profile the caller made (the simulator's sketched
  // histories, sim/workload/history_sketch.h).
  RouteResult RouteWithProfile(uint64_t user, const ShardProfile& profile,
                               std::span<const int> exclude = {});
  // `generation` (RouteResult::node_generation; 0 = any) must match the slot's node.
  void Completed(int node, uint64_t generation = 0);
  // The node answered that it held no K/V of the user: drop the speculative belief.
  void Forget(int node, uint64_t user, uint64_t generation = 0);

  std::vector<NodeStatus> Nodes() const;
  ClusterStats Stats() const;
  const ClusterOptions& options() const { return options_; }
  Weights weights() const;
  // Replaces the scorer's weights (online calibration, calibration.h); INVALID_ARGUMENT unless
  // they are finite, non-negative and sum to 1 (± 1e-9).
  absl::Status SetWeights(const Weights& weights);

 private:
  // Route's decision once the profile is known (`keep_profile`: the cached one stays).
  RouteResult RouteLocked(uint64_t user, const ShardProfile& profile, bool keep_profile,
                          std::span<const int> exclude) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Node;
  // A cached profile entry: the shard's interned id and its count.
  struct __attribute__((packed)) CompactEntry {
    uint32_t shard = 0;
    uint16_t count = 0;  // saturates
  };
  struct UserEntry {
    std::vector<CompactEntry> profile;  // most counted first
    int affinity = -1;
    int speculative_node = -1;  // dispatched there, not yet confirmed by an event
    absl::Time speculative_expiry;
    uint64_t last_use = 0;
  };
  Cluster(const ClusterOptions& options, const Weights& weights, Clock& clock);
  // l(n); `stale_before` = now − max_report_age (computed once per decision).
  double LoadLocked(const Node& n, absl::Time stale_before) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void ForgetSpeculativeLocked(int node, uint64_t user) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetShardLocked(int node, ShardKey shard, bool resident) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t InternLocked(ShardKey shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the id when no profile names it and no node holds it.
  void MaybeFreeLocked(uint32_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetProfileLocked(UserEntry& entry, const ShardProfile& profile)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropNodeStateLocked(int node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimUsersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterOptions options_;
  const size_t words_;  // 64-bit words of a node bitset
  Clock& clock_;

  mutable absl::Mutex mu_;
  Weights weights_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);  // by index; null = free
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;              // Node::generation
  // Residency shards the router knows (named by a cached profile or held by a node), interned to
  // dense ids so a decision reads each profile shard's node set without a hash lookup:
  // bits_[id · words_ ...] is the set of nodes holding shard id; refs_[id] counts the cached
  // profiles naming it.
  absl::flat_hash_map<ShardKey, uint32_t> shard_id_ ABSL_GUARDED_BY(mu_);
  std::vector<ShardKey> shard_key_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> refs_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> bits_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, UserEntry> users_ ABSL_GUARDED_BY(mu_);
  uint64_t use_clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_robin_ ABSL_GUARDED_BY(mu_) = 0;
  SplitMix64 rng_ ABSL_GUARDED_BY(mu_);
  ClusterStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<NodeSignal> signals_ ABSL_GUARDED_BY(mu_);   // scratch
  std::vector<uint32_t> emb_counts_ ABSL_GUARDED_BY(mu_);  // scratch, by node index
};

// Whether a request that failed on a node goes to another (the router's one retry): yes for
// UNAVAILABLE (the node is down, draining or unreachable) and for RESOURCE_EXHAUSTED refused at
// admission; no for a late shed (common/shed.h: it waited out the node's max_delay; a second
// queue would answer it past its SLO with capacity the cluster lacks) and for every other code
// (the request's own error, its deadline).
bool RetryElsewhere(const absl::Status& failed);

}  // namespace hlem::router
