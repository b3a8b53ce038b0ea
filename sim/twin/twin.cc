#include "sim/twin/twin.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "common/status_macros.h"

namespace hlem::sim {

struct Twin::Request {
  TraceRequest trace;
  TwinOutcome outcome;
  std::vector<int> tried;
  bool recorded = false;  // the client has its outcome (an answer, or its deadline passed)
};

Twin::Twin(const TwinOptions& options)
    : options_(options), clock_(absl::UnixEpoch()), start_(absl::UnixEpoch()) {}

Twin::~Twin() {
  // Nodes first (their timers and callbacks refer to the compute units and the router).
  nodes_.clear();
  graveyard_.clear();
  router_.reset();
  compute_.clear();
}

absl::StatusOr<std::unique_ptr<Twin>> Twin::Create(const TwinOptions& options,
                                                   const WorkloadConfig& workload) {
  if (options.nodes == 0) return absl::InvalidArgumentError("twin.nodes: must be >= 1");
  if (!(options.alpha >= 0 && options.alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("twin.alpha: ", options.alpha, " not in [0, 1]"));
  }
  if (options.feed_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("twin.feed_delay: must be >= 0");
  }
  const auto& features = options.node.local.pipeline.features;
  if (features.size() != workload.features.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the trace's events have ", workload.features.size(),
                     " features, the node's model ", features.size()));
  }
  for (size_t f = 0; f < features.size(); ++f) {
    if (workload.features[f].rows > features[f].rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "trace feature ", f, " (", workload.features[f].name, ") has ", workload.features[f].rows,
          " rows, the node's table ", features[f].table_id, " only ", features[f].rows));
    }
  }
  std::unique_ptr<Twin> twin(new Twin(options));
  ASSIGN_OR_RETURN(twin->generator_, WorkloadGenerator::Create(workload));
  RETURN_IF_ERROR(twin->Build());
  return twin;
}

absl::Status Twin::Build() {
  const CostModel& costs = options_.costs;
  if (costs.compute_units == 0) {
    for (uint32_t i = 0; i < options_.nodes; ++i) {
      compute_.push_back(std::make_unique<SharedCompute>(clock_, 1.0));
    }
  } else {
    compute_.push_back(std::make_unique<SharedCompute>(clock_, costs.compute_units));
  }
  router::ClusterOptions ro = options_.router;
  ro.features.clear();
  for (const serving::FeatureSpec& f : options_.node.local.pipeline.features) {
    ro.features.push_back(
        {.table_id = f.table_id, .residency_shard_rows = options_.node.local.residency_shard_rows});
  }
  ro.max_nodes = std::max(ro.max_nodes, options_.nodes);
  ASSIGN_OR_RETURN(router_, router::Cluster::Create(ro, clock_));
  RETURN_IF_ERROR(router::RetryBudget::Validate(options_.retry_budget));
  retry_budget_ = std::make_unique<router::RetryBudget>(options_.retry_budget, clock_);
  if (options_.history_sketch) {
    if (options_.node.emb_sample < 2) {
      return absl::InvalidArgumentError(
          "twin.history_sketch: needs EMB sampling (emb_sample >= 2); row level has no sketch");
    }
    if (std::any_of(options_.faults.begin(), options_.faults.end(),
                    [](const FaultEvent& e) { return e.shard_event(); })) {
      return absl::InvalidArgumentError(
          "twin.history_sketch: not with shard faults (a sketch has no unsampled rows to "
          "partition)");
    }
    HistorySketchOptions so{.every = options_.node.emb_sample};
    for (const router::FeatureShards& f : ro.features) {
      so.table_ids.push_back(f.table_id);
      so.shard_rows.push_back(f.residency_shard_rows);
    }
    ASSIGN_OR_RETURN(sketcher_, HistorySketcher::Create(*generator_, so));
  }
  if (options_.calibration.has_value()) {
    if (options_.calibration_every == 0) {
      return absl::InvalidArgumentError("twin.calibration_every: must be >= 1");
    }
    ASSIGN_OR_RETURN(calibrator_, router::CostCalibrator::Create(*options_.calibration, ro.scorer));
  }
  if (options_.shards.has_value() &&
      std::any_of(options_.faults.begin(), options_.faults.end(),
                  [](const FaultEvent& e) { return e.shard_event(); })) {
    ASSIGN_OR_RETURN(shards_, SimShards::Create(*options_.shards, clock_));
  }
  RETURN_IF_ERROR(
      ValidateFaultPlan(options_.faults, options_.nodes,
                        options_.shards.has_value() ? options_.shards->client.map.num_shards : 0));
  if (options_.fault_detection < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("twin.fault_detection: must be >= 0");
  }
  if (options_.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("twin.deadline: must be > 0");
  }
  slots_.resize(options_.nodes);
  nodes_.resize(options_.nodes);
  slot_of_index_.assign(ro.max_nodes, -1);
  for (uint32_t i = 0; i < options_.nodes; ++i) {
    RETURN_IF_ERROR(BringUp(i, /*epoch=*/1));
    if (slots_[i].router_index != static_cast<int>(i)) {
      return absl::InternalError(
          absl::StrCat("router index ", slots_[i].router_index, " for node ", i));
    }
  }
  return absl::OkStatus();
}

absl::Status Twin::BringUp(size_t i, uint64_t epoch) {
  const CostModel& costs = options_.costs;
  SimNodeOptions o = options_.node;
  o.local.node.node_id = absl::StrCat("node-", i);
  o.local.node.seed = options_.node.local.node.seed + i;
  o.local.memory.initial_alpha = options_.alpha;
  o.local.link.latency += costs.copy_overhead;  // what a transfer costs beyond the link
  SharedCompute& compute = *compute_[compute_.size() == 1 ? 0 : i];
  ASSIGN_OR_RETURN(std::unique_ptr<SimNode> node,
                   SimNode::Create(o, costs, compute, *generator_, epoch, clock_, shards_.get(),
                                   sketcher_.get()));
  ASSIGN_OR_RETURN(int index, router_->AddNode(o.local.node.node_id, o.local.node.node_id));
  Slot& slot = slots_[i];
  slot.incarnation += 1;
  slot.epoch = epoch;
  slot.down = false;
  slot.router_index = index;
  slot_of_index_[static_cast<size_t>(index)] = static_cast<int>(i);
  router_->Reset(index, node->node->Snapshot());
  // The router's residency stream: every event, in order, feed_delay later (none of an
  // incarnation that has died since).
  node->events->Subscribe(
      [this, i, index, inc = slot.incarnation](const serving::ResidencyEvent& e) {
        clock_.ScheduleAfter(options_.feed_delay, [this, i, index, inc, e] {
          if (router_ != nullptr && slots_[i].incarnation == inc && !slots_[i].down) {
            (void)router_->Apply(index, e);
          }
        });
      });
  if (nodes_[i] != nullptr) graveyard_.push_back(std::move(nodes_[i]));
  nodes_[i] = std::move(node);
  return absl::OkStatus();
}

absl::Status Twin::KillNode(size_t i) {
  if (i >= nodes_.size()) return absl::InvalidArgumentError(absl::StrCat("no node ", i));
  Slot& slot = slots_[i];
  if (slot.down) return absl::FailedPreconditionError(absl::StrCat("node ", i, " is dead"));
  slot.down = true;
  slot.incarnation += 1;  // its pending callbacks and residency events are void from now on
  slot.detect_at = clock_.Now() + options_.fault_detection;
  stats_.kills += 1;
  // The process is gone: its timers stop (the object stays: timers already queued refer to it).
  SimNode& dead = *nodes_[i];
  dead.node->Stop();
  dead.memory->Stop();
  dead.refiller->Cancel();
  // Requests in flight there: the connection breaks (UNAVAILABLE; the router retries once).
  std::vector<std::pair<uint64_t, InFlight>> broken(slot.in_flight.begin(), slot.in_flight.end());
  slot.in_flight.clear();
  std::sort(broken.begin(), broken.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });  // deterministic
  const int index = slot.router_index;
  for (auto& [trace_index, f] : broken) {
    stats_.killed_in_flight += 1;
    router_->Completed(index);
    Answered(f.request, index, f.attempt, f.received, f.load,
             absl::UnavailableError(absl::StrCat("node-", i, " died (connection reset)")));
  }
  // The router notices after fault_detection and drops it (and its residency).
  clock_.ScheduleAfter(options_.fault_detection, [this, i, inc = slot.incarnation] {
    Slot& s = slots_[i];
    if (s.incarnation != inc || s.router_index < 0) return;
    router_->RemoveNode(s.router_index);
    slot_of_index_[static_cast<size_t>(s.router_index)] = -1;
    s.router_index = -1;
  });
  return absl::OkStatus();
}

absl::Status Twin::RestartNode(size_t i) {
  if (i >= nodes_.size()) return absl::InvalidArgumentError(absl::StrCat("no node ", i));
  Slot& slot = slots_[i];
  if (!slot.down) return absl::FailedPreconditionError(absl::StrCat("node ", i, " is alive"));
  if (slot.router_index >= 0) {  // back before the router noticed: its new epoch replaces it
    router_->RemoveNode(slot.router_index);
    slot_of_index_[static_cast<size_t>(slot.router_index)] = -1;
    slot.router_index = -1;
  }
  stats_.restarts += 1;
  RETURN_IF_ERROR(BringUp(i, slot.epoch + 1));
  nodes_[i]->Start();
  return absl::OkStatus();
}

bool Twin::ReadSource(TraceRequest* out) {
  if (!ahead_.empty()) {
    *out = std::move(ahead_.front());
    ahead_.pop_front();
    return true;
  }
  return !sealed_ && next_(out);
}

void Twin::Prefetch(absl::Duration until) {
  const auto limit = static_cast<uint64_t>(absl::ToInt64Nanoseconds(until));
  while (!sealed_ && !source_done_ && (ahead_.empty() || ahead_.back().t_ns < limit)) {
    TraceRequest r;
    if (!next_(&r)) {
      source_done_ = true;
      break;
    }
    ahead_.push_back(std::move(r));
  }
}

bool Twin::ScheduleNext() {
  auto r = std::make_shared<Request>();
  if (trace_done_ || (source_done_ && ahead_.empty()) || !ReadSource(&r->trace)) {
    trace_done_ = true;
    return false;
  }
  if (r->trace.t_ns < last_t_ns_) {
    trace_error_ =
        absl::InvalidArgumentError(absl::StrCat("trace request ", read_, " goes back in time (",
                                                r->trace.t_ns, " ns < ", last_t_ns_, " ns)"));
    trace_done_ = true;
    return false;
  }
  last_t_ns_ = r->trace.t_ns;
  const size_t F = options_.node.local.pipeline.features.size();
  if (sketcher_ != nullptr && r->trace.prior_events == 0 && !r->trace.new_events.empty()) {
    r->trace.omitted_events += r->trace.new_events.size() / F;  // sketched, as if read so
    r->trace.new_events.clear();
  }
  if (sketcher_ == nullptr && r->trace.omitted_events > 0) {
    trace_error_ = absl::InvalidArgumentError(absl::StrCat(
        "trace request ", read_, " leaves its events out, and the twin does not sketch histories"));
    trace_done_ = true;
    return false;
  }
  r->outcome = {.index = read_++,
                .sent_ns = r->trace.t_ns,
                .user = r->trace.user,
                .candidates = static_cast<uint32_t>(r->trace.candidates.size() / F)};
  outcomes_.push_back(r->outcome);  // sent_ns known now: AnsweredBefore reads it (unanswered)
  clock_.ScheduleAt(start_ + absl::Nanoseconds(static_cast<int64_t>(r->trace.t_ns)), [this, r] {
    ScheduleNext();  // keeps one request read ahead
    if (options_.costs.background_cpu > absl::ZeroDuration() && compute_.size() == 1) {
      background_ += options_.costs.background_cpu;
      compute_[0]->Run(options_.costs.background_cpu, [] {});
    }
    clock_.ScheduleAfter(Hop(*r), [this, r] {
      retry_budget_->OnRequest();
      Dispatch(r, 0);
    });
    // The client's deadline (the load generator's gRPC deadline): DEADLINE_EXCEEDED then, whatever
    // the router and the nodes are still doing with the request; a later answer is dropped.
    clock_.ScheduleAfter(options_.deadline, [this, r] {
      if (r->recorded) return;
      r->outcome.code = absl::StatusCode::kDeadlineExceeded;
      r->outcome.message = "Deadline Exceeded";
      Record(*r);
    });
  });
  return true;
}

absl::Duration Twin::Hop(const Request& r) const {
  return options_.costs.router_overhead / 2 *
         options_.costs.Slowdown(r.trace.user, r.trace.prior_events);
}

void Twin::Dispatch(std::shared_ptr<Request> r, int attempt) {
  const TraceRequest& t = r->trace;
  const auto route_start = std::chrono::steady_clock::now();
  router::RouteResult route;
  if (attempt > 0) {
    route = router_->Route(t.user, {}, true, r->tried);
  } else if (t.omitted_events > 0 && t.prior_events == 0 && t.new_events.empty()) {
    // A sketched first visit: the profile of the sketch's expected events per shard.
    const HistorySketch& sketch = sketcher_->Sketch(t.user, 0, t.omitted_events);
    std::vector<router::ProfileEntry> counts;
    counts.reserve(sketch.shards.size());
    for (const HistorySketch::Shard& s : sketch.shards) {
      counts.push_back({.shard = {router_->options().features[s.feature].table_id, s.shard},
                        .count = static_cast<uint32_t>(std::llround(s.events))});
    }
    route = router_->RouteWithProfile(
        t.user, router::ShardProfile::TopOf(counts, router_->options().profile_top_k), r->tried);
  } else {
    route = router_->Route(t.user, t.new_events, /*delta=*/t.prior_events > 0, r->tried);
  }
  stats_.route_calls += 1;
  stats_.route_wall_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - route_start).count();
  const int n = route.decision.node;
  if (n < 0) {
    if (attempt == 0 || route.decision.reason == router::Reason::kShed) {
      r->outcome.code = route.decision.reason == router::Reason::kShed
                            ? absl::StatusCode::kResourceExhausted
                            : absl::StatusCode::kUnavailable;
      r->outcome.message = route.decision.reason == router::Reason::kShed
                               ? "every serving node is above the load threshold"
                               : "no live serving node";
    }
    clock_.ScheduleAfter(Hop(*r), [this, r] { Record(*r); });
    return;
  }
  const size_t s = static_cast<size_t>(slot_of_index_[static_cast<size_t>(n)]);
  r->outcome.node = static_cast<int>(s);
  r->outcome.h_kv = route.decision.h_kv;
  r->outcome.h_emb = route.decision.h_emb;
  r->outcome.best_h_kv = route.decision.best_h_kv;
  r->outcome.best_h_emb = route.decision.best_h_emb;
  serving::InferInput in{
      .user = t.user,
      .history = t.new_events,
      .candidates = t.candidates,
      .expected_kv_resident = route.decision.h_kv >= 1.0,
      .deadline = start_ + absl::Nanoseconds(static_cast<int64_t>(t.t_ns)) + options_.deadline,
      .delta = serving::ClientPrefix{.len = t.prior_events, .hash = 0},
      .omitted_events = t.omitted_events};
  const absl::Time received = clock_.Now();
  const double load = route.decision.load;
  Slot& slot = slots_[s];
  if (slot.down) {  // dead, and the router has not noticed yet: the connection is refused
    stats_.sent_to_dead += 1;
    if (clock_.Now() >= slot.detect_at) stats_.sent_to_dead_after_detection += 1;
    router_->Completed(n);
    Answered(r, n, attempt, received, load,
             absl::UnavailableError(absl::StrCat("node-", s, " is down (connection refused)")));
    return;
  }
  slot.in_flight[r->outcome.index] = {
      .request = r, .attempt = attempt, .received = received, .load = load};
  nodes_[s]->node->Infer(std::move(in),
                         [this, r, n, s, attempt, received, load,
                          inc = slot.incarnation](absl::StatusOr<serving::InferOutput> out) {
                           if (slots_[s].incarnation != inc)
                             return;  // the node died: the kill answered it
                           slots_[s].in_flight.erase(r->outcome.index);
                           router_->Completed(n);
                           Answered(r, n, attempt, received, load, std::move(out));
                         });
}

void Twin::Answered(const std::shared_ptr<Request>& r, int n, int attempt, absl::Time received,
                    double load, absl::StatusOr<serving::InferOutput> out) {
  r->tried.push_back(n);
  TwinOutcome& o = r->outcome;
  o.node_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(clock_.Now() - received));
  o.code = out.status().code();
  o.message = std::string(out.status().message());
  if (out.ok()) {
    o.cached_prefix_tokens = out->cached_prefix_tokens;
    o.computed_tokens = out->computed_tokens;
    o.emb_hits = out->emb_hits;
    o.emb_misses = out->emb_misses;
    o.stale_kv_hit = out->stale_kv_hit;
    // The node service's split (node_service.cc): lookup = emb - fetch - copy; queue = the
    // rest.
    auto ns = [](absl::Duration d) {
      return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Nanoseconds(d)));
    };
    o.fetch_ns = ns(out->fetch_seconds);
    o.copy_ns = ns(out->copy_seconds);
    o.lookup_ns = ns(out->emb_seconds - out->fetch_seconds - out->copy_seconds);
    o.compute_ns = ns(out->compute_seconds);
    o.kv_ns = ns(out->kv_seconds);
    const uint64_t accounted = ns(out->emb_seconds + out->compute_seconds + out->kv_seconds);
    o.queue_ns = o.node_ns > accounted ? o.node_ns - accounted : 0;
    if (out->stale_kv_hit) router_->Forget(n, r->trace.user);
    if (calibrator_ != nullptr) Calibrate(*out, o.queue_ns, load);
  } else if (attempt == 0 && !r->recorded && router::RetryElsewhere(out.status())) {
    if (retry_budget_->TryRetry()) {
      ++stats_.retries;
      Dispatch(r, 1);  // the router's one retry on another node, while the deadline lasts
      return;
    }
    ++stats_.retries_over_budget;
  }
  clock_.ScheduleAfter(Hop(*r), [this, r] { Record(*r); });
}

void Twin::Calibrate(const serving::InferOutput& out, uint64_t queue_ns, double load) {
  calibrator_->Observe({.computed_tokens = out.computed_tokens,
                        .history_tokens = out.history_tokens,
                        .emb_hits = out.emb_hits,
                        .emb_misses = out.emb_misses,
                        .compute_seconds = absl::ToDoubleSeconds(out.compute_seconds),
                        .fetch_seconds = absl::ToDoubleSeconds(out.fetch_seconds),
                        .queue_seconds = static_cast<double>(queue_ns) * 1e-9,
                        .load = load});
  if (++observed_ % options_.calibration_every != 0) return;
  const router::CalibrationState st = calibrator_->State();
  if (st.calibrated) (void)router_->SetWeights(st.weights);  // valid: shares of positive costs
}

void Twin::Record(Request& r) {
  if (r.recorded) return;  // the deadline came first
  r.recorded = true;
  TwinOutcome o = r.outcome;
  o.latency_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(clock_.Now() - start_) -
                                       static_cast<int64_t>(o.sent_ns));
  // The router's span: from its receipt (a quarter of the overhead after the send) to its
  // response (a quarter before the client has it).
  const auto hops = static_cast<uint64_t>(absl::ToInt64Nanoseconds(Hop(r)));
  o.router_ns = o.latency_ns > hops ? o.latency_ns - hops : 0;
  for (uint64_t v : {o.index, static_cast<uint64_t>(o.code), o.latency_ns,
                     static_cast<uint64_t>(o.node + 1), uint64_t{o.cached_prefix_tokens}}) {
    hash_ = Mix64(hash_ ^ v);
  }
  o.answered = true;
  outcomes_[o.index] = std::move(o);
  ++answered_;
}

absl::Status Twin::Start(std::function<bool(TraceRequest*)> next) {
  if (started_) return absl::FailedPreconditionError("Twin::Start: call once");
  started_ = true;
  wall_start_ = std::chrono::steady_clock::now();
  next_ = std::move(next);
  for (auto& node : nodes_) node->Start();
  for (const FaultEvent& e : options_.faults) {
    if (e.allocator()) continue;  // the control loop's (sim/twin/control.h)
    if (e.shard_event()) {
      clock_.ScheduleAt(start_ + e.at, [this, e] {
        using Kind = FaultEvent::Kind;
        stats_.shard_events += 1;
        shards_->Set(e.shard, e.kind == Kind::kKillShard   ? SimShards::State::kKilled
                              : e.kind == Kind::kStopShard ? SimShards::State::kStopped
                                                           : SimShards::State::kUp);
      });
      continue;
    }
    clock_.ScheduleAt(start_ + e.at, [this, e] {
      // Valid by ValidateFaultPlan: the node is alive for a kill, dead for a restart.
      (void)(e.kind == FaultEvent::Kind::kKillNode ? KillNode(e.node) : RestartNode(e.node));
    });
  }
  ScheduleNext();
  return absl::OkStatus();
}

void Twin::RunUntil(absl::Duration t) {
  const absl::Time until = start_ + t;
  while (clock_.NextTime() <= until) {
    clock_.RunNext();
    ++timers_;
  }
  if (clock_.Now() < until) clock_.AdvanceTo(until);
}

bool Twin::AnsweredBefore(absl::Duration t) const {
  const auto limit = static_cast<uint64_t>(absl::ToInt64Nanoseconds(t));
  if (!trace_done_ && last_t_ns_ < limit) return false;  // more requests may come before t
  // Outcomes are in trace (= sent) order; the answered prefix only grows.
  while (answered_prefix_ < outcomes_.size() && outcomes_[answered_prefix_].answered) {
    ++answered_prefix_;
  }
  return answered_prefix_ == outcomes_.size() || outcomes_[answered_prefix_].sent_ns >= limit;
}

absl::Status Twin::SetAlpha(double alpha) {
  for (size_t i = 0; i < nodes_.size(); ++i) RETURN_IF_ERROR(SetAlpha(i, alpha));
  return absl::OkStatus();
}

absl::Status Twin::SetAlpha(size_t node, double alpha) {
  if (node >= nodes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("node ", node, " of ", nodes_.size()));
  }
  return nodes_[node]->node->SetAlpha(alpha, /*allocator_epoch=*/1, ++decision_).status();
}

absl::Status Twin::Finish() {
  if (!started_ || finished_)
    return absl::FailedPreconditionError("Twin::Finish: after Start, once");
  finished_ = true;
  while (!done() && clock_.RunNext()) ++timers_;
  for (auto& node : nodes_) {
    const serving::KvCacheStats kv = node->kv->Stats();
    const serving::EmbCacheStats emb = node->emb->GetStats();
    for (uint64_t v :
         {kv.lookups, kv.tokens_reused, kv.evictions_lru, emb.hits, emb.misses, emb.evictions}) {
      hash_ = Mix64(hash_ ^ v);
    }
  }
  absl::Duration busy;
  for (const auto& c : compute_) busy += c->busy();
  stats_ = {
      .requests = read_,
      .timers_run = timers_,
      .simulated = clock_.Now() - start_,
      .wall_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start_).count(),
      .log_hash = hash_,
      .node_cpu = busy - background_,
      .background = background_,
      .route_calls = stats_.route_calls,
      .route_wall_seconds = stats_.route_wall_seconds,
      .retries = stats_.retries,
      .retries_over_budget = stats_.retries_over_budget,
      .kills = stats_.kills,
      .restarts = stats_.restarts,
      .killed_in_flight = stats_.killed_in_flight,
      .sent_to_dead = stats_.sent_to_dead,
      .sent_to_dead_after_detection = stats_.sent_to_dead_after_detection,
      .shard_events = stats_.shard_events,
      .shard_fetches = shards_ != nullptr ? shards_->counters() : SimShards::Counters{}};
  if (!trace_error_.ok()) return trace_error_;
  if (answered_ != read_) {
    return absl::InternalError(
        absl::StrCat(read_ - answered_, " requests never got an outcome (simulation stalled)"));
  }
  return absl::OkStatus();
}

absl::Status Twin::Run(std::function<bool(TraceRequest*)> next) {
  RETURN_IF_ERROR(Start(std::move(next)));
  return Finish();
}

}  // namespace hlem::sim
