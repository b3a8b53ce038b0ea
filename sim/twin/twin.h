#pragma once
// The digital twin (ARCHITECTURE §8; issue 6): a cluster of simulated serving nodes (SimNode: the
// real caches, memory manager and serving::Node) behind the real router core (router::Cluster),
// replaying a workload trace on a SimClock. Single-threaded and deterministic: one event heap
// (SimClock's timers: integer nanoseconds, ties in scheduling order), no threads, no wall-clock
// reads; randomness is keyed (the trace's own, the router's seeded tie-breaks), so two runs that
// differ only in α see the same requests.
//
// A request: sent at its trace time; the router decides after half the router overhead (the
// client → router hop and the decision) and hands it to the chosen node in delta form (the new
// events and the count before them; the router extends the user's cached shard profile with
// them); the node answers; the client has the answer half the router overhead later. Residency
// events reach the router `feed_delay` after the node publishes them (in order, as the
// router's stream delivers them). Every request gets exactly one outcome.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "router/core/calibration.h"
#include "router/core/cluster.h"
#include "router/core/retry_budget.h"
#include "sim/twin/cost_model.h"
#include "sim/twin/faults.h"
#include "sim/twin/shared_compute.h"
#include "sim/twin/sim_node.h"
#include "sim/workload/workload.h"

namespace hlem::sim {

struct TwinOptions {
  SimNodeOptions node;  // every node's (node.local.node.node_id is replaced by node-<i>)
  uint32_t nodes = 4;
  CostModel costs;
  router::ClusterOptions router;            // policy, weights; the features are set from the node's
  router::RetryBudgetOptions retry_budget;  // the router's (router/core/retry_budget.h)
  absl::Duration feed_delay = absl::Milliseconds(1);
  double alpha = 0.5;  // every node's α at the start (a static α unless changed later)
  // Online calibration of the router's weights from the answers (router/core/calibration.h), as
  // `router --calibrate-costs` does; applied every `calibration_every` answers. Off when unset.
  std::optional<router::CalibrationOptions> calibration;
  uint32_t calibration_every = 64;
  // Node kills and restarts during the replay (sim/twin/faults.h), and how long after a kill the
  // router notices (its health checks; until then requests routed there fail at once and are
  // retried on another node).
  std::vector<FaultEvent> faults;
  absl::Duration fault_detection = absl::Seconds(2);
  // The embedding shards (map, tables, the nodes' shard-client timings), for the plan's shard
  // faults (sim/twin/sim_shards.h); used only when the plan has shard events. Unset or unused, a
  // fetch costs what the cost model says and never fails.
  std::optional<SimShardOptions> shards;
  // The deadline every request carries (the load generator's --deadline-ms, 1 s by default),
  // enforced where the real system enforces it: the client gets DEADLINE_EXCEEDED when it passes;
  // the node answers a request that expired in its queue, before an embedding fetch or before
  // compute with DEADLINE_EXCEEDED; a shard fetch waits for an unanswering server until then.
  absl::Duration deadline = absl::Seconds(1);
  // Sketched histories (sim/workload/history_sketch.h; needs node.emb_sample >= 2, no shard
  // faults): a first visit's events are not drawn row by row (a trace read with
  // TraceReader::OmitFirstVisits leaves them out; others are dropped on arrival). The router gets
  // the sketch's expected shard profile, the nodes its sampled rows and expected distinct rows.
  // The trace's events must be the workload generator's (a generated trace).
  bool history_sketch = false;
};

// One request's outcome.
struct TwinOutcome {
  uint64_t index = 0;    // in the trace
  uint64_t sent_ns = 0;  // trace time
  uint64_t latency_ns = 0;
  uint64_t router_ns = 0;  // router receipt to response (latency - the client's hops)
  uint64_t node_ns = 0;    // node receipt to answer
  // How the node spent it, as the real node reports it (InferTimings).
  uint64_t queue_ns = 0, lookup_ns = 0, fetch_ns = 0, copy_ns = 0, compute_ns = 0, kv_ns = 0;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string message;
  uint64_t user = 0;
  int node = -1;
  double h_kv = 0, h_emb = 0;
  double best_h_kv = 0, best_h_emb = 0;  // the best over the routable nodes (locality given up)
  uint32_t candidates = 0, cached_prefix_tokens = 0, computed_tokens = 0;
  uint64_t emb_hits = 0, emb_misses = 0;
  bool stale_kv_hit = false;
  bool answered = false;  // the outcome is final
};

struct TwinStats {
  uint64_t requests = 0;
  uint64_t timers_run = 0;  // simulation events
  absl::Duration simulated;
  double wall_seconds = 0;
  uint64_t log_hash = 0;      // of every outcome in completion order and the nodes' final counters
  absl::Duration node_cpu;    // unit-time the nodes' modelled work took on the compute units
  absl::Duration background;  // background_cpu submitted (CostModel)
  // The router's Route calls and their wall time on this machine (the real router code; the
  // simulated routing cost is CostModel::router_overhead): how routing scales with the nodes.
  uint64_t route_calls = 0;
  double route_wall_seconds = 0;
  // Retries elsewhere the router's retry budget sent, and held back (answered with the error).
  uint64_t retries = 0, retries_over_budget = 0;
  // Faults (TwinOptions::faults): kills and restarts done, requests in flight at a node when it
  // was killed, requests routed to a dead node before the router noticed, and after (must be 0).
  uint64_t kills = 0, restarts = 0, killed_in_flight = 0, sent_to_dead = 0,
           sent_to_dead_after_detection = 0;
  // Shard faults: events done, and the nodes' fetches as SimShards counts them.
  uint64_t shard_events = 0;
  SimShards::Counters shard_fetches;
};

class Twin {
 public:
  // `workload` is the trace's generator config (the trace header's): the twin regenerates old
  // events from it. Errors name the option.
  static absl::StatusOr<std::unique_ptr<Twin>> Create(const TwinOptions& options,
                                                      const WorkloadConfig& workload);
  ~Twin();

  // Replays the requests `next` yields (in time order) until each has its outcome: Start, then
  // Finish. Call once. INVALID_ARGUMENT when the trace goes back in time.
  absl::Status Run(std::function<bool(TraceRequest*)> next);

  // Step by step (the allocator's loop, the oracle's forks): Start once, RunUntil any number of
  // times with growing t, SetAlpha between them, Finish once.
  absl::Status Start(std::function<bool(TraceRequest*)> next);
  // Runs every event due up to `t` after the start; Now() is then start + t.
  void RunUntil(absl::Duration t);
  // Runs until every request has its outcome, then closes the books (stats()).
  absl::Status Finish();
  // True when the trace is read to its end and every request has its outcome.
  bool done() const { return trace_done_ && answered_ == read_; }
  // True when every request sent before `t` after the start has its outcome.
  bool AnsweredBefore(absl::Duration t) const;
  absl::Duration elapsed() { return clock_.Now() - start_; }
  // Reads the trace ahead into memory up to `until` after the start; SealSource() then stops all
  // further reading from the source (a forked copy of the twin must not move the file offset it
  // shares with its parent): the trace ends, for this copy, where the read-ahead ends.
  void Prefetch(absl::Duration until);
  void SealSource() { sealed_ = true; }
  // Pushes α to every node (or one), as the allocator does: a fresh decision id each time.
  absl::Status SetAlpha(double alpha);
  absl::Status SetAlpha(size_t node, double alpha);

  // Outcomes by trace index.
  const std::vector<TwinOutcome>& outcomes() const { return outcomes_; }
  const TwinOptions& options() const { return options_; }
  const TwinStats& stats() const { return stats_; }
  // A killed node stays here, stopped, until its restart replaces it.
  SimNode& node(size_t i) { return *nodes_[i]; }
  // Faults by hand (TwinOptions::faults schedules them): FAILED_PRECONDITION when the node is
  // already dead (KillNode) or alive (RestartNode).
  absl::Status KillNode(size_t i);
  absl::Status RestartNode(size_t i);
  bool node_up(size_t i) const { return !slots_[i].down; }
  // Node i's incarnation epoch (1, then one more per restart).
  uint64_t node_epoch(size_t i) const { return slots_[i].epoch; }
  // The shards when the plan has shard faults (else null).
  const SimShards* shards() const { return shards_.get(); }
  // The router's index of node i (-1 while it is out of the router).
  int router_index(size_t i) const { return slots_[i].router_index; }
  size_t num_nodes() const { return nodes_.size(); }
  router::Cluster& router() { return *router_; }
  // The router's cost calibration (when options().calibration is set).
  std::optional<router::CalibrationState> calibration() const {
    if (calibrator_ == nullptr) return std::nullopt;
    return calibrator_->State();
  }
  SimClock& clock() { return clock_; }

 private:
  struct Request;
  explicit Twin(const TwinOptions& options);
  absl::Status Build();
  // Reads the next request and schedules its arrival; false at the end of the trace.
  bool ScheduleNext();
  bool ReadSource(TraceRequest* out);  // the read-ahead first, then the source
  // Routes (attempt 0, or the router's one retry elsewhere: router::RetryElsewhere).
  void Dispatch(std::shared_ptr<Request> r, int attempt);
  // A node's answer to attempt `attempt` at router index `n` (router_->Completed done by then).
  void Answered(const std::shared_ptr<Request>& r, int n, int attempt, absl::Time received,
                double load, absl::StatusOr<serving::InferOutput> out);
  // Node i's SimNode (a new incarnation on restart), joined to the router.
  absl::Status BringUp(size_t i, uint64_t epoch);
  // One client-router-node hop of a request (half the router overhead, slowed down).
  absl::Duration Hop(const Request& r) const;
  // The client's outcome of `r`, once: its answer or its deadline, whichever comes first.
  void Record(Request& r);
  // Feeds one answer to the calibrator; every calibration_every answers, its weights to the router.
  void Calibrate(const serving::InferOutput& out, uint64_t queue_ns, double load);

  const TwinOptions options_;
  SimClock clock_;
  std::unique_ptr<WorkloadGenerator> generator_;
  std::unique_ptr<HistorySketcher> sketcher_;            // with options_.history_sketch
  std::vector<std::unique_ptr<SharedCompute>> compute_;  // one shared, or one per node
  std::vector<std::unique_ptr<SimNode>> nodes_;
  // Per node: its incarnation (callbacks of an older one are ignored), state, router index, and
  // the attempts in flight there (failed at once when it is killed).
  struct InFlight {
    std::shared_ptr<Request> request;
    int attempt = 0;
    absl::Time received;
    double load = 0;
  };
  struct Slot {
    uint32_t incarnation = 0;
    uint64_t epoch = 0;
    bool down = false;
    int router_index = -1;
    absl::Time detect_at;                               // when the router notices the kill
    absl::flat_hash_map<uint64_t, InFlight> in_flight;  // by trace index
  };
  std::vector<Slot> slots_;
  std::vector<int> slot_of_index_;                   // router index -> node
  std::vector<std::unique_ptr<SimNode>> graveyard_;  // killed incarnations (timers may refer)
  std::unique_ptr<router::Cluster> router_;
  std::unique_ptr<router::RetryBudget> retry_budget_;
  std::unique_ptr<SimShards> shards_;                   // when the plan has shard faults
  std::unique_ptr<router::CostCalibrator> calibrator_;  // when options_.calibration is set
  uint64_t observed_ = 0;                               // answers the calibrator saw
  std::vector<TwinOutcome> outcomes_;
  std::function<bool(TraceRequest*)> next_;
  std::deque<TraceRequest> ahead_;  // Prefetch's read-ahead
  bool started_ = false, finished_ = false, trace_done_ = false, sealed_ = false,
       source_done_ = false;
  uint64_t read_ = 0, answered_ = 0, last_t_ns_ = 0, timers_ = 0, decision_ = 0;
  mutable size_t answered_prefix_ = 0;  // outcomes_[0, this) are answered (AnsweredBefore)
  absl::Duration background_;           // background_cpu submitted so far
  std::chrono::steady_clock::time_point wall_start_;
  absl::Status trace_error_;
  TwinStats stats_;
  uint64_t hash_ = 0x7477696e6c6f6731ULL;  // "twinlog1"
  absl::Time start_;
};

}  // namespace hlem::sim
