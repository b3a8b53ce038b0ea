#pragma once
// What the load generator recorded, per request and summarised per decision window and overall.
// Pure functions: the replayer fills the outcomes, the CLI prints and writes them, tests check
// them.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "sim/workload/workload.h"

namespace hlem::loadgen {

// One trace request's single outcome.
struct Outcome {
  uint64_t index = 0;         // in the trace
  uint64_t scheduled_ns = 0;  // trace time ÷ speed
  uint64_t sent_ns = 0;       // when it went out (since the replay's start); = scheduled if never
  uint64_t latency_ns = 0;    // sent to answered
  uint64_t router_ns = 0;     // of which at the router (receipt to response; OK answers)
  uint64_t node_ns = 0;       // of which at the node that answered (OK answers)
  struct Stages {             // how the node spent node_ns (InferTimings)
    uint64_t queue_ns = 0, lookup_ns = 0, fetch_ns = 0, copy_ns = 0, compute_ns = 0, kv_ns = 0;
  } stages;
  int code = -1;        // absl::StatusCode; -1 = no outcome (a bug: never left so)
  std::string message;  // the error's message (empty when OK)
  uint64_t user = 0;
  std::string node;
  double h_kv = 0, h_emb = 0;
  uint32_t candidates = 0;
  uint32_t cached_prefix_tokens = 0, computed_tokens = 0;  // computed: new history + candidates
  uint64_t emb_hits = 0, emb_misses = 0;  // distinct rows served from the EMB cache / fetched
  bool stale_kv_hit = false, retried = false;
  bool delta = false;   // sent in delta mode
  bool resent = false;  // delta refused (FAILED_PRECONDITION), resent in full
  bool sent = false;    // false: refused by the client (in-flight cap), never sent
};

struct Summary {
  uint64_t window = 0;  // index (overall: 0)
  uint64_t requests = 0, ok = 0, within_slo = 0;
  double seconds = 0;                         // the window's length (overall: the replay's span)
  double p50_ms = 0, p90_ms = 0, p99_ms = 0;  // OK answers
  double slo_satisfaction = 0;                // OK within the SLO ÷ requests (failures miss it)
  double throughput = 0;                      // OK answers per second
  double kv_reuse = 0;  // cached ÷ (cached + computed history) tokens, OK answers
  uint64_t stale_kv_hits = 0;
  std::map<std::string, uint64_t> codes;  // by name
};

// A named span of the replay's clock (a phase of the trace: steady, trend, burst).
struct PhaseSpan {
  std::string name;
  uint64_t start_ns = 0, end_ns = 0;
};

// The spans of a trace's phases (its generator config's) on a replay `speed` times faster than
// the trace: back to back from 0, each phase's duration ÷ speed.
std::vector<PhaseSpan> PhaseSpans(const std::vector<sim::Phase>& phases, double speed);

struct PhaseSummary {
  PhaseSpan span;  // start_ns raised to the warm-up's end where it falls inside
  Summary summary;
};

struct Report {
  Summary overall;  // requests scheduled at or after warmup_ns
  uint64_t warmup_ns = 0;
  std::vector<Summary> windows;      // by scheduled time
  std::vector<PhaseSummary> phases;  // requests scheduled in each span, after the warm-up
};

// INTERNAL when an outcome has no code (a request left without its one outcome).
absl::Status Check(const std::vector<Outcome>& outcomes);
// Requests scheduled before `warmup_ns` (caches filling) count in their windows only. Each phase
// summarises the requests scheduled in its span after the warm-up; its throughput is OK answers
// per second of that span.
Report Summarize(const std::vector<Outcome>& outcomes, uint64_t window_ns, double slo_ms,
                 uint64_t warmup_ns = 0, const std::vector<PhaseSpan>& phases = {});

// CSV with a header line: one row per request / per window.
std::string OutcomesCsv(const std::vector<Outcome>& outcomes);
std::string WindowsCsv(const Report& report);
// One row per phase: phase,start_s,end_s,requests,ok,p50_ms,p90_ms,p99_ms,slo_satisfaction,
// throughput,kv_reuse,errors.
std::string PhasesCsv(const Report& report);
// Human-readable overall summary and a table of windows.
std::string FormatReport(const Report& report, double slo_ms);

}  // namespace hlem::loadgen
