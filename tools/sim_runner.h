#pragma once
// One run of the digital twin over a trace file, as `hlem sim` and `hlem eval` make it: the setup
// read once from the node config, the cost model and the trace's header (shared by a sweep's
// runs), then the whole trace at a static α or under a controller, summarised as `hlem loadgen`
// summarises a real run.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator_service/core/registry.h"
#include "sim/twin/control.h"
#include "sim/twin/oracle.h"
#include "sim/twin/twin.h"
#include "sim/workload/trace.h"
#include "tools/loadgen/summary.h"

namespace hlem::tools {

// Opens the trace for a run: the reader and the callback the twin pulls requests with.
struct TraceSource {
  std::unique_ptr<sim::TraceReader> reader;
  absl::Status error;
  std::function<bool(sim::TraceRequest*)> Next() {
    return [this](sim::TraceRequest* r) {
      absl::StatusOr<bool> more = reader->Next(r);
      if (!more.ok()) error = more.status();
      return more.ok() && *more;
    };
  }
};

// Everything a run needs but the α: read once, shared by a sweep's runs.
struct SimSetup {
  sim::TwinOptions twin;
  sim::WorkloadConfig workload;
  std::string trace;
  double slo_ms = 0;
  uint64_t window_ns = 0, warmup_ns = 0;
  allocator::ControllerSpec controller;  // allocator/core/registry.h; its α is the run's
  // Set: the controller (static ones too) is tracked against α*_t (sim::TrackControlled).
  std::optional<sim::OracleOptions> track;
};

struct SimSetupOptions {
  std::string trace;
  std::string node_config = "deploy/local/node.yaml";
  std::string costs = "sim/costs/cpu-local-cluster.yaml";
  std::string router = "hlem";
  uint32_t nodes = 4, emb_sample = 1;
  bool history_sketch = false;  // sketched first visits (TwinOptions::history_sketch)
  bool calibrate_costs = true;  // the router's online cost calibration (router --calibrate-costs)
  allocator::ControllerSpec controller{.name = "static"};  // and the α runs start at
  double slo_ms = 0;                                       // 0: the node config's
  double warmup_s = 0;
  // Node, allocator and shard faults (sim/twin/faults.h): a plan ("kill:1@5s,restart:1@7s,
  // stop:shard0@9s,cont:shard0@12s") or "random:SEED:KILLS[:SHARD_FAULTS]" over the trace's
  // duration; "" = none.
  std::string faults;
  double fault_detection_s = 2;
  double deadline_ms = 1000;  // every request's (the load generator's --deadline-ms)
};

// Reads the configs and the trace's header; errors name the flag (--trace, --controller, ...).
absl::StatusOr<SimSetup> PrepareSim(const SimSetupOptions& options);

struct SimRunResult {
  loadgen::Report report;
  std::vector<loadgen::Outcome> outcomes;
  sim::TwinStats stats;
  std::string nodes;  // a line per node: its caches and link over the whole run
  std::vector<sim::ControlRecord> decisions;  // under a controller
  std::vector<sim::TrackedWindow> tracked;    // with SimSetup::track
  // Locality the router gave up (OK answers after the warm-up): the share of them that had a
  // node with the user's K/V and went elsewhere, and the mean of best h_emb − the chosen node's.
  double kv_given_up = 0, emb_given_up = 0;
  double emb_hit_rate = 0;  // EMB rows hit ÷ looked up, OK answers after the warm-up
};

// The whole trace through a twin starting at α: static, or under the setup's controller (one per
// node; its decisions in *decisions); with s.track, tracked against α*_t (into *tracked).
absl::StatusOr<std::unique_ptr<sim::Twin>> RunTwin(
    const SimSetup& s, double alpha, std::vector<sim::ControlRecord>* decisions = nullptr,
    std::vector<sim::TrackedWindow>* tracked = nullptr);
// RunTwin, summarised; checks that every request has exactly one outcome.
absl::StatusOr<SimRunResult> RunOnce(const SimSetup& s, double alpha);

// A line per node over the whole run (beyond 16 nodes: the cluster's totals and the spread).
std::string NodeLines(sim::Twin& twin);
// Simulated time, wall time, requests and events, and the event-log hash.
std::string SpeedLine(const sim::TwinStats& t);
// The reward of ARCHITECTURE §3 over the whole run.
double RunReward(const loadgen::Summary& s, double slo_ms);

}  // namespace hlem::tools
