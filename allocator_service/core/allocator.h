#pragma once
// The allocator's control loop without RPC (ARCHITECTURE §3, issue 7): every round it reads each
// known node's closed windows (GetState) concurrently, lets that node's controller decide on each
// new window in order, and pushes the resulting α (SetAlpha on the node's admin port) with this
// allocator's epoch and a decision id that only grows. The service drives RunRound() every
// interval on the wall clock and talks gRPC through a NodeApi; tests drive it with fake nodes and
// a simulated clock.
//
// Rules:
//   - one controller instance per node incarnation: a node that restarts (new incarnation epoch)
//     gets a fresh controller and history;
//   - a node that does not answer GetState keeps the α it has (nothing is pushed) and is polled
//     again next round (a NO_STATE record);
//   - a push that fails is retried every round until the node takes it (or a newer decision
//     replaces it); the node meanwhile serves with its last α;
//   - the allocator going away leaves every node at its last α (nodes never need the allocator
//     to serve).
// Thread-safe: RunRound() from one thread at a time; AddNode/RemoveNode and the readers from any.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator_service/core/controller.h"
#include "common/clock.h"

namespace hlem::allocator {

// What the loop needs from the nodes. Both calls are asynchronous: `done` runs exactly once (on
// any thread, possibly before the call returns), within about `timeout`.
class NodeApi {
 public:
  struct State {
    std::string node_id;
    uint64_t incarnation = 0;
    std::vector<WindowState> windows;  // the node's most recent closed windows, oldest first
  };
  struct Push {
    double alpha = 0;
    uint64_t allocator_epoch = 0;
    uint64_t decision_id = 0;
    std::string allocator_id;
  };
  struct Applied {
    double alpha_effective = 0;
    uint64_t incarnation = 0;
  };
  virtual ~NodeApi() = default;
  virtual void GetState(const std::string& address, absl::Duration timeout,
                        std::function<void(absl::StatusOr<State>)> done) = 0;
  virtual void SetAlpha(const std::string& admin_address, const Push& push, absl::Duration timeout,
                        std::function<void(absl::StatusOr<Applied>)> done) = 0;
};

struct NodeRef {
  std::string address;        // serving port (GetState); the node's key
  std::string admin_address;  // admin port (SetAlpha)
};

struct AllocatorOptions {
  absl::Duration interval = absl::Seconds(5);     // the service's round period
  absl::Duration rpc_timeout = absl::Seconds(1);  // per GetState / SetAlpha
  uint64_t epoch = 1;        // this allocator's incarnation (> 0; grows across restarts)
  std::string allocator_id;  // for the nodes' logs
  std::string controller;    // its name, for the records
  size_t max_history = 64;   // windows kept per node for its controller
  size_t keep_decisions = 4096;
};

// One decision (or a NO_STATE hold) as the API's Decision message carries it.
struct DecisionRecord {
  uint64_t decision_id = 0;  // 0 for a hold (nothing pushed)
  std::string node_id, address;
  absl::Time decided_at;
  uint64_t window_index = 0;
  double alpha_before = 0, alpha_after = 0;
  Reason reason = Reason::kHold;
  bool no_state = false;  // GetState failed: α held
  std::string detail;
  uint64_t latency_ns = 0;  // the controller's Decide on the loop's clock (0 on a SimClock)
  double reward = 0;        // of the observed window
  WindowState observed;
  bool applied = false;
  std::string apply_error;
};

struct NodeStatus {
  NodeRef ref;
  std::string node_id;
  uint64_t incarnation = 0;
  double alpha = 0;          // last pushed successfully (or the node's, before any push)
  bool reachable = false;    // last GetState and last SetAlpha succeeded
  bool pending = false;      // a decided α not yet taken by the node
  uint64_t last_window = 0;  // index of the last window decided on
  bool has_decision = false;
  DecisionRecord last;
};

struct RoundStats {
  uint64_t round = 0;
  size_t nodes = 0, polled_ok = 0, poll_failed = 0, decisions = 0, pushes = 0, push_failed = 0;
  size_t no_new_window = 0;
  absl::Duration wall;   // poll, decide and push, on the loop's clock
  absl::Duration learn;  // the controllers' Learn after the pushes (the online adapter's training)
};

struct AllocatorCounters {
  uint64_t rounds = 0, decisions = 0, pushes = 0, push_failures = 0, poll_failures = 0;
  uint64_t incarnations = 0;  // fresh controllers for new or restarted nodes
};

using ControllerFactory = std::function<std::unique_ptr<Controller>()>;

class Allocator {
 public:
  // INVALID_ARGUMENT for an epoch of 0, a non-positive interval or timeout, max_history or
  // keep_decisions of 0.
  static absl::StatusOr<std::unique_ptr<Allocator>> Create(const AllocatorOptions& options,
                                                           NodeApi& nodes, Clock& clock,
                                                           ControllerFactory make);
  // Membership: a node joins or leaves (keyed by its serving address). Idempotent.
  void AddNode(const NodeRef& node);
  void RemoveNode(const std::string& address);

  // One round: poll every node, decide, push; returns when every call has answered.
  RoundStats RunRound();

  std::vector<NodeStatus> Nodes() const;  // by address
  // Records with decision_id > after (after = 0: the last `max` records), oldest first; `gap`
  // set when records after `after` were already dropped. Holds (id 0) come only with after = 0.
  std::vector<DecisionRecord> Decisions(const std::string& node_id, size_t max, uint64_t after,
                                        bool* gap) const;
  AllocatorCounters counters() const;
  const AllocatorOptions& options() const { return options_; }

 private:
  struct Node {
    NodeRef ref;
    std::string node_id;
    uint64_t incarnation = 0;
    bool known = false;  // a state was read for this incarnation
    std::unique_ptr<Controller> controller;
    bool learn_pending = false;  // Decide ran, Learn not yet (the round thread's only)
    std::deque<WindowState> history;
    uint64_t next_window = 0;  // first window index not decided on
    double alpha = 0;          // α the node is known to have
    bool pushed = false;       // a push was taken in this incarnation (else α is the window's)
    double pending_alpha = 0;
    bool pending = false;
    uint64_t pending_id = 0;
    bool reachable = false;
    bool removed = false;
    bool has_decision = false;
    DecisionRecord last;
  };
  Allocator(const AllocatorOptions& options, NodeApi& nodes, Clock& clock, ControllerFactory make)
      : options_(options), api_(nodes), clock_(clock), make_(std::move(make)) {}
  void Record(DecisionRecord r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AllocatorOptions options_;
  NodeApi& api_;
  Clock& clock_;
  const ControllerFactory make_;
  absl::Mutex round_mu_;  // one round at a time
  mutable absl::Mutex mu_;
  // shared: a round keeps polling a node that leaves meanwhile; its results are then dropped.
  absl::flat_hash_map<std::string, std::shared_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  std::deque<DecisionRecord> decisions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_decision_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t dropped_after_ ABSL_GUARDED_BY(mu_) = 0;  // highest decision id dropped
  AllocatorCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::allocator
