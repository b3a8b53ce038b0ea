#include "tools/sim_runner.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "sim/twin/faults.h"
#include "sim/twin/oracle.h"
#include "tools/twin_setup.h"

namespace hlem::tools {

absl::StatusOr<SimSetup> PrepareSim(const SimSetupOptions& f) {
  SimSetup s;
  ASSIGN_OR_RETURN(TwinSetup setup, LoadTwinSetup({.node_config = f.node_config,
                                                   .costs = f.costs,
                                                   .router = f.router,
                                                   .nodes = f.nodes,
                                                   .emb_sample = f.emb_sample,
                                                   .history_sketch = f.history_sketch}));
  if (f.calibrate_costs) setup.twin.calibration = router::CalibrationOptions{};
  s.controller = f.controller;
  if (absl::StatusOr<allocator::ControllerFactory> check =
          allocator::MakeControllerFactory(s.controller);
      !check.ok()) {
    return check.status();
  }
  auto reader = sim::TraceReader::Open(f.trace);
  if (!reader.ok()) {
    return absl::Status(reader.status().code(),
                        absl::StrCat("--trace: ", reader.status().message()));
  }
  auto workload = sim::ParseWorkloadConfig((*reader)->header().config_yaml);
  if (!workload.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trace: its header's workload config: ", workload.status().message()));
  }
  if (f.history_sketch && !(*reader)->header().generated_events) {
    // A sketch draws the history from the header's generator: an explicit trace's events may
    // come from elsewhere.
    return absl::InvalidArgumentError(
        "--history-sketch: needs a trace with generated events (hlem workload generate without "
        "--explicit-events); this one's events are explicit");
  }
  s.workload = *workload;
  s.trace = f.trace;
  s.twin = setup.twin;
  s.twin.fault_detection = absl::Seconds(f.fault_detection_s);
  s.twin.deadline = absl::Microseconds(f.deadline_ms * 1e3);
  const uint32_t shards = s.twin.shards.has_value() ? s.twin.shards->client.map.num_shards : 0;
  absl::StatusOr<std::vector<sim::FaultEvent>> plan = sim::FaultPlanFromSpec(
      f.faults, s.twin.nodes, shards,
      absl::Nanoseconds(static_cast<int64_t>((*reader)->header().duration_ns)));
  if (!plan.ok()) return absl::InvalidArgumentError(absl::StrCat("--", plan.status().message()));
  s.twin.faults = *std::move(plan);
  if (absl::Status v = sim::ValidateFaultPlan(s.twin.faults, s.twin.nodes, shards); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", v.message()));
  }
  s.twin.alpha = f.controller.alpha;
  s.slo_ms = f.slo_ms > 0 ? f.slo_ms : absl::ToDoubleMilliseconds(setup.slo);
  s.window_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(workload->window));
  s.warmup_ns = static_cast<uint64_t>(f.warmup_s * 1e9);
  return s;
}

std::string NodeLines(sim::Twin& twin) {
  std::string out;
  const double seconds = absl::ToDoubleSeconds(twin.stats().simulated);
  const int miss = static_cast<int>(serving::CopyPurpose::kEmbMiss);
  const int refill = static_cast<int>(serving::CopyPurpose::kEmbRefill);
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  const bool each = twin.num_nodes() <= 16;
  std::vector<uint64_t> per_node;
  double lookups = 0, reused = 0, requested = 0, hits = 0, emb_lookups = 0, copies = 0,
         copy_bytes = 0, refill_bytes = 0, busiest_link = 0;
  for (size_t i = 0; i < twin.num_nodes(); ++i) {
    sim::SimNode& n = twin.node(i);
    const serving::KvCacheStats kv = n.kv->Stats();
    const serving::EmbCacheStats emb = n.emb->GetStats();
    const serving::DeviceCopyStats dev = n.device->stats();
    const double link = ratio(dev.link_busy_ns / 1e9, seconds);
    if (each) {
      absl::StrAppendFormat(
          &out,
          "node-%d: %d requests, KV reuse %.1f %% of tokens, EMB hits %.1f %% of rows, %.1f miss "
          "copies (%.1f KiB) per request, refill %.1f MiB, link busy %.1f %%\n",
          i, kv.lookups, 100 * ratio(kv.tokens_reused, kv.tokens_requested),
          100 * ratio(emb.hits, emb.lookups), ratio(dev.copies[miss], kv.lookups),
          ratio(dev.bytes[miss], kv.lookups) / 1024, dev.bytes[refill] / 1048576.0, 100 * link);
    }
    per_node.push_back(kv.lookups);
    lookups += kv.lookups;
    reused += kv.tokens_reused;
    requested += kv.tokens_requested;
    hits += emb.hits;
    emb_lookups += emb.lookups;
    copies += dev.copies[miss];
    copy_bytes += dev.bytes[miss];
    refill_bytes += dev.bytes[refill];
    busiest_link = std::max(busiest_link, link);
  }
  if (!each && !per_node.empty()) {
    std::sort(per_node.begin(), per_node.end());
    absl::StrAppendFormat(
        &out,
        "%d nodes: requests per node min %d, median %d, max %d; KV reuse %.1f %% of tokens, EMB "
        "hits %.1f %% of rows, %.1f miss copies (%.1f KiB) per request, refill %.1f MiB, busiest "
        "link %.1f %%\n",
        per_node.size(), per_node.front(), per_node[per_node.size() / 2], per_node.back(),
        100 * ratio(reused, requested), 100 * ratio(hits, emb_lookups), ratio(copies, lookups),
        ratio(copy_bytes, lookups) / 1024, refill_bytes / 1048576.0, 100 * busiest_link);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<sim::Twin>> RunTwin(const SimSetup& s, double alpha,
                                                   std::vector<sim::ControlRecord>* decisions,
                                                   std::vector<sim::TrackedWindow>* tracked) {
  sim::TwinOptions options = s.twin;
  options.alpha = alpha;
  auto twin = sim::Twin::Create(options, s.workload);
  if (!twin.ok()) return twin.status();
  auto reader = sim::TraceReader::Open(s.trace);
  if (!reader.ok()) return reader.status();
  (*reader)->OmitFirstVisits(options.history_sketch);
  TraceSource source{.reader = std::move(*reader)};
  absl::Status st;
  if (s.controller.name == "static" && !s.track.has_value()) {
    st = (*twin)->Run(source.Next());
  } else {
    allocator::ControllerSpec spec = s.controller;
    spec.alpha = alpha;  // the static α of "recovery"; where the others start
    absl::StatusOr<allocator::ControllerFactory> make = allocator::MakeControllerFactory(spec);
    if (!make.ok()) return make.status();
    const sim::ControlOptions control{.window = s.twin.node.local.node.window};
    if (s.track.has_value()) {
      absl::StatusOr<sim::Tracked> t =
          sim::TrackControlled(**twin, source.Next(), *make, control, *s.track);
      st = t.status();
      if (t.ok() && decisions != nullptr) *decisions = std::move(t->decisions);
      if (t.ok() && tracked != nullptr) *tracked = std::move(t->windows);
    } else {
      absl::StatusOr<std::vector<sim::ControlRecord>> records =
          sim::RunControlled(**twin, source.Next(), *make, control);
      st = records.status();
      if (records.ok() && decisions != nullptr) *decisions = std::move(*records);
    }
  }
  if (!source.error.ok()) return source.error;
  if (!st.ok()) return st;
  return std::move(*twin);
}

namespace {

// One line on the controller's decisions: how many, by reason, and the first that was not the
// static α's.
std::string DecisionsLine(const std::vector<sim::ControlRecord>& records) {
  std::map<std::string, uint64_t> by_reason;
  const sim::ControlRecord* first = nullptr;
  for (const sim::ControlRecord& r : records) {
    ++by_reason[allocator::ReasonName(r.reason)];
    if (first == nullptr && r.reason != allocator::Reason::kStatic) first = &r;
  }
  std::string line = absl::StrCat("allocator: ", records.size(), " decisions");
  for (const auto& [reason, n] : by_reason) absl::StrAppend(&line, ", ", reason, " ", n);
  if (first != nullptr) {
    absl::StrAppend(&line, "; first ", allocator::ReasonName(first->reason), " at window ",
                    first->window, " on node-", first->node, ": ", first->detail);
  }
  return line + "\n";
}

}  // namespace

absl::StatusOr<SimRunResult> RunOnce(const SimSetup& s, double alpha) {
  std::vector<sim::ControlRecord> decisions;
  std::vector<sim::TrackedWindow> tracked;
  absl::StatusOr<std::unique_ptr<sim::Twin>> twin = RunTwin(s, alpha, &decisions, &tracked);
  if (!twin.ok()) return twin.status();
  SimRunResult result;
  result.tracked = std::move(tracked);
  if (s.controller.name != "static") result.nodes = DecisionsLine(decisions);
  result.decisions = std::move(decisions);
  result.stats = (*twin)->stats();
  result.nodes += NodeLines(**twin);
  if (std::optional<router::CalibrationState> c = (*twin)->calibration(); c.has_value()) {
    absl::StrAppendFormat(
        &result.nodes,
        "router weights at the end: kv %.3f, emb %.3f, load %.3f (%s; C_kv %.3f ms, C_emb %.3f "
        "ms, C_ld %.3f ms)\n",
        c->weights.kv, c->weights.emb, c->weights.load,
        c->calibrated ? "calibrated" : "configured: too few answers", c->c_kv * 1e3, c->c_emb * 1e3,
        c->c_load * 1e3);
  }
  double answered = 0, hits = 0, rows = 0;
  for (const sim::TwinOutcome& o : (*twin)->outcomes()) {
    if (o.code == absl::StatusCode::kOk && o.sent_ns >= s.warmup_ns) {
      answered += 1;
      result.kv_given_up += o.best_h_kv >= 1 && o.h_kv < 1;
      result.emb_given_up += o.best_h_emb - o.h_emb;
      hits += static_cast<double>(o.emb_hits);
      rows += static_cast<double>(o.emb_hits + o.emb_misses);
    }
  }
  if (answered > 0) {
    result.kv_given_up /= answered;
    result.emb_given_up /= answered;
  }
  result.emb_hit_rate = rows > 0 ? hits / rows : 0;
  for (const sim::TwinOutcome& o : (*twin)->outcomes()) {
    result.outcomes.push_back({.index = o.index,
                               .scheduled_ns = o.sent_ns,
                               .sent_ns = o.sent_ns,
                               .latency_ns = o.latency_ns,
                               .router_ns = o.router_ns,
                               .node_ns = o.node_ns,
                               .stages = {.queue_ns = o.queue_ns,
                                          .lookup_ns = o.lookup_ns,
                                          .fetch_ns = o.fetch_ns,
                                          .copy_ns = o.copy_ns,
                                          .compute_ns = o.compute_ns,
                                          .kv_ns = o.kv_ns},
                               .code = static_cast<int>(o.code),
                               .message = o.message,
                               .user = o.user,
                               .node = o.node < 0 ? "" : absl::StrCat("node-", o.node),
                               .h_kv = o.h_kv,
                               .h_emb = o.h_emb,
                               .candidates = o.candidates,
                               .cached_prefix_tokens = o.cached_prefix_tokens,
                               .computed_tokens = o.computed_tokens,
                               .emb_hits = o.emb_hits,
                               .emb_misses = o.emb_misses,
                               .stale_kv_hit = o.stale_kv_hit,
                               .delta = true,
                               .sent = true});
  }
  if (absl::Status check = loadgen::Check(result.outcomes); !check.ok()) return check;
  result.report = loadgen::Summarize(result.outcomes, s.window_ns, s.slo_ms, s.warmup_ns);
  return result;
}

std::string SpeedLine(const sim::TwinStats& t) {
  const double simulated = absl::ToDoubleSeconds(t.simulated);
  return absl::StrFormat(
      "simulated %.1f s in %.2f s of wall time (%.1fx real time), %d requests (%.0f/s of wall "
      "time), %d events; log hash %016x\n",
      simulated, t.wall_seconds, t.wall_seconds > 0 ? simulated / t.wall_seconds : 0, t.requests,
      t.wall_seconds > 0 ? static_cast<double>(t.requests) / t.wall_seconds : 0, t.timers_run,
      t.log_hash);
}

// The reward of ARCHITECTURE §3 over the whole run (sim::Reward: failures count as never
// answered, so over 1 % of failures puts P99 at the cap).
double RunReward(const loadgen::Summary& s, double slo_ms) {
  const bool failing = s.requests > 0 && (s.requests - s.ok) * 100 > s.requests;
  return sim::Reward(s.slo_satisfaction,
                     failing ? absl::InfiniteDuration() : absl::Microseconds(s.p99_ms * 1e3),
                     absl::Microseconds(slo_ms * 1e3));
}

}  // namespace hlem::tools
