#pragma once
// One serving node without RPC (ARCHITECTURE §2, §3): admission in front of the request queue,
// the per-window statistics the allocator reads, α changes fenced by the allocator's epoch,
// drain, load reports and the residency snapshot. The gRPC services (serving_node/service) only
// translate protos to these calls; the simulator and tests drive the same class on a SimClock.
//
// Admission (Infer): a draining node answers UNAVAILABLE; a request the pipeline would reject
// (bad candidates, ids out of range) is answered at once; a request that would take the tokens
// in flight (events + candidates of admitted, unanswered requests) past `max_in_flight_tokens`
// is RESOURCE_EXHAUSTED (unless nothing is in flight); the rest go to the RequestQueue, which
// answers RESOURCE_EXHAUSTED itself when full. Every request gets exactly one answer.
//
// Windows (ARCHITECTURE §3; every `window` on the clock, or CloseWindow() directly):
//   requests              answered in the window, any code;
//   hot-user ratio        OK answers whose user had an OK answer in this or the previous
//                         `hot_windows` windows ÷ OK answers;
//   KV / EMB hit rates    from the caches' counters (window_stats.h);
//   mean sequence length  history tokens (after trimming) per OK answer, and ÷ max_history;
//   SLO violations        judged requests that took longer than the SLO or failed for a reason
//                         that is not the client's (anything but INVALID_ARGUMENT, OUT_OF_RANGE,
//                         FAILED_PRECONDITION, NOT_FOUND) ÷ judged requests (all but client
//                         errors) — shed requests count as violations;
//   stale-hit rate        OK answers sent with expected_kv_resident that found no prefix ÷ OK
//                         answers sent with expected_kv_resident;
//   P50 / P99             latency (receipt to answer) of judged requests, from at most
//                         `latency_samples` samples per window (uniform reservoir);
//   load                  max(in-flight tokens ÷ max_in_flight_tokens, queue depth ÷ queue
//                         limit), 1 while draining; mean over the load-report ticks.
// Load reports go into the residency event log every `load_report_interval` and whenever the load
// moved by `load_report_change` since the last one. Thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rng.h"
#include "serving_node/core/device.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/memory_manager.h"
#include "serving_node/core/pipeline.h"
#include "serving_node/core/refill.h"
#include "serving_node/core/request_queue.h"
#include "serving_node/core/residency_events.h"
#include "serving_node/core/residency_state.h"
#include "serving_node/core/residency_tracker.h"
#include "serving_node/core/window_stats.h"

namespace hlem::serving {

struct NodeOptions {
  std::string node_id = "node-0";
  absl::Duration slo = absl::Milliseconds(50);
  absl::Duration window = absl::Seconds(5);
  uint32_t hot_windows = 12;   // previous windows that make a user "returning"
  uint32_t keep_windows = 12;  // closed windows kept for GetState (>= 1)
  double p99_norm_cap = 4.0;   // p99_norm = min(P99 / SLO, cap) / cap
  uint64_t max_in_flight_tokens = 1 << 16;
  absl::Duration load_report_interval = absl::Seconds(1);
  double load_report_change = 0.1;
  uint32_t latency_samples = 1 << 16;  // per window
  uint64_t seed = 1;                   // latency reservoir
  // How often the node checks whether the EMB budget grew (α up: pages arrive as idle KV users
  // are reclaimed) to kick the refiller.
  absl::Duration refill_check_interval = absl::Milliseconds(20);
};

// What runs the requests the node admitted: in the services the RequestQueue in front of the
// Pipeline (QueuedPipeline below); in the simulator a cost-model executor on the simulated clock
// (sim/twin/sim_node.h), so the node's admission, windows, load reports and α handling are the
// same code in both.
class InferExecutor {
 public:
  virtual ~InferExecutor() = default;
  // The checks made before admission (the pipeline's: candidates, feature ids, ranges).
  virtual absl::Status Check(const InferInput& in) const = 0;
  // Runs an admitted request; `done` runs exactly once with its outcome.
  virtual void Submit(InferInput in, RequestQueue::Done done) = 0;
  virtual uint64_t queue_depth() const = 0;  // waiting, not yet running
  virtual size_t features() const = 0;       // feature ids per event
  virtual uint32_t max_history() const = 0;  // events in the window
};

class QueuedPipeline final : public InferExecutor {
 public:
  QueuedPipeline(Pipeline& pipeline, RequestQueue& queue) : pipeline_(pipeline), queue_(queue) {}
  absl::Status Check(const InferInput& in) const override { return pipeline_.Check(in); }
  void Submit(InferInput in, RequestQueue::Done done) override {
    queue_.Submit(std::move(in), std::move(done));
  }
  uint64_t queue_depth() const override { return queue_.stats().depth; }
  size_t features() const override { return pipeline_.options().features.size(); }
  uint32_t max_history() const override { return pipeline_.options().max_history; }

 private:
  Pipeline& pipeline_;
  RequestQueue& queue_;
};

// What the node is made of; all borrowed, all must outlive the node. `refiller` and `tracker` may
// be null. Requests run through `executor`, or when it is null through `queue` and `pipeline`.
struct NodeParts {
  Pipeline* pipeline = nullptr;
  RequestQueue* queue = nullptr;
  InferExecutor* executor = nullptr;
  MemoryManager* memory = nullptr;
  KvCache* kv = nullptr;
  EmbCache* emb = nullptr;
  Device* device = nullptr;
  ResidencyEventLog* events = nullptr;
  ResidencyState* residency = nullptr;  // follows `events`
  Refiller* refiller = nullptr;
  ResidencyTracker* tracker = nullptr;
  uint32_t row_bytes = 0;            // bytes of one embedding row
  double link_bytes_per_second = 0;  // for the window report; 0 if unknown
  uint32_t max_queue = 0;            // the queue's limit, for the load signal
};

// One closed window: WindowStats of the API (protos/hlem/v1/common.proto), field for field.
struct NodeWindow {
  uint64_t index = 0;
  absl::Time start;
  absl::Duration duration;
  uint64_t requests = 0;
  double hot_user_ratio = 0;
  double kv_hit_rate = 0;
  double kv_user_hit_rate = 0;
  double emb_hit_rate = 0;
  double mean_seq_len_norm = 0;
  double mean_seq_len_tokens = 0;
  double slo_violation_fraction = 0;
  double stale_hit_rate = 0;
  uint32_t hot_window_count = 0;
  uint32_t max_history_tokens = 0;
  double alpha_target = 0;
  double alpha_effective = 0;
  double p50_seconds = 0;
  double p99_seconds = 0;
  double p99_norm = 0;
  double slo_seconds = 0;
  double p99_norm_cap = 0;
  double load = 0;
  uint32_t queue_depth = 0;
  uint64_t in_flight_tokens = 0;
  double mean_load = 0;
  uint64_t pool_bytes = 0;
  uint64_t kv_bytes = 0;
  uint64_t emb_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t refill_bytes = 0;
  uint64_t refill_backlog_bytes = 0;
  uint64_t emb_miss_bytes = 0;
  uint64_t shard_fetch_bytes = 0;
  double link_utilization_ratio = 0;
  double link_bytes_per_second = 0;
};

// NodeGauges of the API, sampled now.
struct NodeGaugesNow {
  double load = 0;
  uint32_t queue_depth = 0;
  uint64_t in_flight_tokens = 0;
  uint64_t in_flight_requests = 0;
  bool draining = false;
  double alpha_target = 0;
  double alpha_effective = 0;
  uint64_t alpha_epoch = 0;
  uint64_t alpha_decision_id = 0;
  uint64_t pool_bytes = 0;
  uint64_t page_bytes = 0;
  uint64_t kv_bytes = 0;
  uint64_t emb_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t kv_resident_users = 0;
  uint64_t emb_resident_rows = 0;
  uint64_t refill_backlog_bytes = 0;
};

struct AlphaResult {
  double alpha_target = 0;
  double alpha_effective = 0;
  uint64_t allocator_epoch = 0;
  uint64_t decision_id = 0;
  bool changed = false;
};

struct DrainResult {
  bool drained = false;
  uint64_t in_flight_requests = 0;
};

// One answered request, for metrics (called on the answering thread before `done`).
struct NodeAnswer {
  absl::StatusCode code = absl::StatusCode::kOk;
  absl::Duration latency;
  const InferOutput* output = nullptr;  // OK answers only
};

class Node {
 public:
  using Done = RequestQueue::Done;

  // INVALID_ARGUMENT (naming the field) for a missing part, a non-positive SLO or window, zero
  // keep_windows, max_in_flight_tokens or latency_samples, or a p99 cap <= 0.
  static absl::StatusOr<std::unique_ptr<Node>> Create(const NodeOptions& options,
                                                      const NodeParts& parts, Clock& clock);
  ~Node();  // Stop(), then waits for answers in progress to finish

  // Starts the window and load-report timers on the clock.
  void Start();
  void Stop();

  // Answers through `done`, exactly once (see Admission above).
  void Infer(InferInput in, Done done);
  absl::StatusOr<InferOutput> InferSync(InferInput in);

  // α in [0, 1] from allocator (epoch > 0, decision): INVALID_ARGUMENT for a bad α or epoch 0,
  // FAILED_PRECONDITION for (epoch, decision) older than the last accepted; the same pair again
  // changes nothing (changed = false). The EMB side's new pages are refilled in the background.
  absl::StatusOr<AlphaResult> SetAlpha(double alpha, uint64_t allocator_epoch,
                                       uint64_t decision_id);

  // Stops admitting (irreversible, idempotent) and reports draining; with `wait`, returns when no
  // request is in flight or at `deadline` (real time), whichever is first.
  DrainResult Drain(bool wait, absl::Time deadline);
  bool draining() const;

  // Closes the current window now (the timer calls this every options.window).
  NodeWindow CloseWindow();
  // The last `max` closed windows (0: 1), oldest first.
  std::vector<NodeWindow> Windows(size_t max) const;
  NodeGaugesNow Gauges() const;
  ResidencySnapshot Snapshot() const { return parts_.residency->Take(); }
  // Publishes a load report now.
  void ReportLoad();

  // Called for every answer (metrics). Set before serving.
  void SetAnswerObserver(std::function<void(const NodeAnswer&)> fn) { observer_ = std::move(fn); }

  const NodeOptions& options() const { return options_; }
  const NodeParts& parts() const { return parts_; }
  uint64_t epoch() const { return parts_.events->epoch(); }

 private:
  Node(const NodeOptions& options, const NodeParts& parts, Clock& clock);
  struct Accumulator;
  void Answer(uint64_t user, bool expected, uint64_t tokens, absl::Time received, bool admitted,
              absl::StatusOr<InferOutput> result, const Done& done);
  double LoadLocked(uint64_t queue_depth) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void MaybeReportLoad();
  void CheckRefill();
  void ScheduleWindow(absl::Time at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(timers_->mu);
  void ScheduleLoadReport(absl::Time at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(timers_->mu);
  void ScheduleRefillCheck(absl::Time at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(timers_->mu);

  const NodeOptions options_;
  const NodeParts parts_;
  std::unique_ptr<InferExecutor> owned_executor_;  // QueuedPipeline when parts_.executor is null
  InferExecutor* const executor_;
  Clock& clock_;
  std::function<void(const NodeAnswer&)> observer_;

  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t in_flight_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t in_flight_requests_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t answering_ ABSL_GUARDED_BY(mu_) = 0;  // threads inside Answer()
  double last_reported_load_ ABSL_GUARDED_BY(mu_) = -1;
  // α fencing.
  uint64_t alpha_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t alpha_decision_ ABSL_GUARDED_BY(mu_) = 0;
  // The open window.
  std::unique_ptr<Accumulator> acc_ ABSL_GUARDED_BY(mu_);
  uint64_t window_index_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, uint64_t> last_served_ ABSL_GUARDED_BY(mu_);  // user -> window
  Rng rng_ ABSL_GUARDED_BY(mu_);
  uint64_t shard_fetch_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // cumulative, miss rows
  uint64_t shard_fetch_bytes_at_close_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t emb_budget_seen_ ABSL_GUARDED_BY(mu_) = 0;  // for CheckRefill
  std::vector<NodeWindow> windows_ ABSL_GUARDED_BY(mu_);
  WindowAggregator memory_windows_;

  absl::Mutex alpha_mu_;  // one SetAlpha at a time
  absl::Mutex close_mu_;  // one CloseWindow at a time (memory sample + request window agree)
  // Shared with the timer callbacks, so one that fires during Stop() finds it alive: a callback
  // runs under `mu` and only while `running`.
  struct Timers {
    absl::Mutex mu;
    bool running ABSL_GUARDED_BY(mu) = false;
    TimerId window ABSL_GUARDED_BY(mu) = 0;
    TimerId load ABSL_GUARDED_BY(mu) = 0;
    TimerId refill ABSL_GUARDED_BY(mu) = 0;
  };
  std::shared_ptr<Timers> timers_ = std::make_shared<Timers>();
};

}  // namespace hlem::serving
