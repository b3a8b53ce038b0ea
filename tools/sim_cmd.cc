// `hlem sim`: the digital twin (sim/twin). `run` replays a trace through simulated serving nodes
// (the real caches, memory manager and node logic) behind the real router core and prints the
// same report as `hlem loadgen` plus the simulator's speed and event-log hash; `sweep` runs it
// for every α of a grid (a static α per run, common random numbers) and names the best one;
// `oracle` finds α* of every decision window by forking the simulation (sim/twin/oracle.h);
// `compare` sets a simulated run beside a real one of the same trace (fidelity); `fit` fits the
// cost model to a real run's stage timings (sim/twin/fit.h).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "allocator_service/core/controller.h"
#include "allocator_service/core/mlp.h"
#include "allocator_service/core/registry.h"
#include "common/status_macros.h"
#include "sim/twin/control.h"
#include "sim/twin/cost_model.h"
#include "sim/twin/fit.h"
#include "sim/twin/oracle.h"
#include "sim/twin/twin.h"
#include "sim/workload/trace.h"
#include "tools/commands.h"
#include "tools/loadgen/summary.h"
#include "tools/sim_runner.h"
#include "tools/twin_setup.h"

namespace hlem::tools {
namespace {

struct SimFlags {
  std::string trace, node_config = "deploy/local/node.yaml",
                     costs = "sim/costs/cpu-local-cluster.yaml";
  std::string router = "hlem", csv, windows_csv, decisions_csv, alphas, follow = "star",
              controller = "static", weights;
  uint32_t nodes = 4, emb_sample = 1;
  bool history_sketch = false;
  double alpha = 0.5, slo_ms = 0, warmup_s = 0;
  double deadband = allocator::ControllerSpec{}.deadband;
  bool quiet = false, calibrate_costs = true;
  std::string faults;
  double fault_detection_s = 2;
  double deadline_ms = 1000;
};

int SimFail(absl::string_view what, const absl::Status& st) { return tools::Fail("sim", what, st); }

absl::StatusOr<SimSetup> Prepare(const SimFlags& f) {
  // Field by field rather than one designated-initializer temporary: GCC 12 at -O3 (the main
  // job's release build) warns that the temporary's nested strings "may be used uninitialized".
  SimSetupOptions o;
  o.trace = f.trace;
  o.node_config = f.node_config;
  o.costs = f.costs;
  o.router = f.router;
  o.nodes = f.nodes;
  o.emb_sample = f.emb_sample;
  o.history_sketch = f.history_sketch;
  o.calibrate_costs = f.calibrate_costs;
  o.controller.name = f.controller;
  o.controller.weights = f.weights;
  o.controller.alpha = f.alpha;
  o.controller.deadband = f.deadband;
  o.slo_ms = f.slo_ms;
  o.warmup_s = f.warmup_s;
  o.faults = f.faults;
  o.fault_detection_s = f.fault_detection_s;
  o.deadline_ms = f.deadline_ms;
  return PrepareSim(o);
}

int WriteFile(const std::string& path, const std::string& body) {
  if (path.empty()) return 0;
  std::ofstream out(path);
  out << body;
  if (!out) {
    std::fprintf(stderr, "hlem sim: cannot write %s\n", path.c_str());
    return 1;
  }
  return 0;
}

int RunSim(const SimFlags& f) {
  absl::StatusOr<SimSetup> s = Prepare(f);
  if (!s.ok()) return SimFail("setup", s.status());
  absl::StatusOr<SimRunResult> r = RunOnce(*s, f.alpha);
  if (!r.ok()) return SimFail("run", r.status());
  std::printf("sim: %s, %u nodes, alpha %.2f, router %s, costs %s (%s)\n%s%s%s", f.trace.c_str(),
              f.nodes, f.alpha, f.router.c_str(), f.costs.c_str(), s->twin.costs.device.c_str(),
              loadgen::FormatReport(r->report, s->slo_ms).c_str(), r->nodes.c_str(),
              SpeedLine(r->stats).c_str());
  if (!s->twin.faults.empty()) {
    const sim::TwinStats& st = r->stats;
    std::printf(
        "faults: --faults '%s' (replays exactly): %llu node kills, %llu restarts; %llu requests in "
        "flight at a killed node, %llu sent to a dead node before the router noticed (%llu "
        "after); %llu shard events: %llu fetches failed over, %llu failed UNAVAILABLE (no live "
        "replica), %llu past their deadline, %llu attempts at a shard that did not answer\n",
        sim::FormatFaultPlan(s->twin.faults).c_str(), static_cast<unsigned long long>(st.kills),
        static_cast<unsigned long long>(st.restarts),
        static_cast<unsigned long long>(st.killed_in_flight),
        static_cast<unsigned long long>(st.sent_to_dead),
        static_cast<unsigned long long>(st.sent_to_dead_after_detection),
        static_cast<unsigned long long>(st.shard_events),
        static_cast<unsigned long long>(st.shard_fetches.failovers),
        static_cast<unsigned long long>(st.shard_fetches.unavailable),
        static_cast<unsigned long long>(st.shard_fetches.deadline_exceeded),
        static_cast<unsigned long long>(st.shard_fetches.failed_attempts));
  }
  // The controller's α per node, in force from the window after `window` on.
  std::string decisions = "window,node,alpha,reason\n";
  for (const sim::ControlRecord& d : r->decisions) {
    absl::StrAppendFormat(&decisions, "%d,%d,%.4f,%s\n", d.window, d.node, d.alpha,
                          allocator::ReasonName(d.reason));
  }
  return std::max({WriteFile(f.csv, loadgen::OutcomesCsv(r->outcomes)),
                   WriteFile(f.windows_csv, loadgen::WindowsCsv(r->report)),
                   WriteFile(f.decisions_csv, decisions)});
}

int Sweep(const SimFlags& f) {
  absl::StatusOr<SimSetup> s = Prepare(f);
  if (!s.ok()) return SimFail("setup", s.status());
  std::vector<double> alphas;
  for (absl::string_view part :
       absl::StrSplit(f.alphas, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    double a = 0;
    if (!absl::SimpleAtod(part, &a) || !(a >= 0 && a <= 1)) {
      return SimFail("--alphas", absl::InvalidArgumentError(
                                     absl::StrCat("'", part, "' is not an α in [0, 1]")));
    }
    alphas.push_back(a);
  }
  if (alphas.empty()) {
    for (int i = 0; i <= 50; ++i) alphas.push_back(i * 0.02);  // ARCHITECTURE §8's grid
  }
  std::string csv =
      "alpha,requests,ok,p50_ms,p90_ms,p99_ms,slo_satisfaction,kv_reuse,reward,wall_s\n";
  std::printf("sim sweep: %s, %u nodes, router %s, costs %s (%s), SLO %.1f ms\n", f.trace.c_str(),
              f.nodes, f.router.c_str(), f.costs.c_str(), s->twin.costs.device.c_str(), s->slo_ms);
  std::printf("%6s %9s %9s %9s %9s %8s %8s %8s\n", "alpha", "requests", "p50_ms", "p90_ms",
              "p99_ms", "slo_%", "kv_%", "reward");
  double best_alpha = -1, best_reward = 0;
  for (double alpha : alphas) {
    absl::StatusOr<SimRunResult> r = RunOnce(*s, alpha);
    if (!r.ok()) return SimFail(absl::StrCat("run at alpha ", alpha), r.status());
    const loadgen::Summary& o = r->report.overall;
    const double reward = RunReward(o, s->slo_ms);
    if (o.ok == 0) {  // no latency to show (α 1: no KV pool); the CSV keeps the codes' count
      std::string codes;
      for (const auto& [code, n] : o.codes) absl::StrAppend(&codes, " ", code, " ", n);
      std::printf("%6.2f %9llu   no request answered OK:%s %8.4f\n", alpha,
                  static_cast<unsigned long long>(o.requests), codes.c_str(), reward);
    } else {
      std::printf("%6.2f %9llu %9.2f %9.2f %9.2f %8.2f %8.1f %8.4f\n", alpha,
                  static_cast<unsigned long long>(o.requests), o.p50_ms, o.p90_ms, o.p99_ms,
                  100 * o.slo_satisfaction, 100 * o.kv_reuse, reward);
    }
    std::fflush(stdout);
    absl::StrAppendFormat(&csv, "%.2f,%d,%d,%.3f,%.3f,%.3f,%.4f,%.4f,%.4f,%.2f\n", alpha,
                          o.requests, o.ok, o.p50_ms, o.p90_ms, o.p99_ms, o.slo_satisfaction,
                          o.kv_reuse, reward, r->stats.wall_seconds);
    if (best_alpha < 0 || reward > best_reward) {
      best_alpha = alpha;
      best_reward = reward;
    }
  }
  std::printf("best static alpha on this grid: %.2f (reward %.4f)\n", best_alpha, best_reward);
  return WriteFile(f.csv, csv);
}

int Oracle(const SimFlags& f) {
  absl::StatusOr<SimSetup> s = Prepare(f);
  if (!s.ok()) return SimFail("setup", s.status());
  sim::TwinOptions options = s->twin;
  options.alpha = f.alpha;
  auto twin = sim::Twin::Create(options, s->workload);
  if (!twin.ok()) return SimFail("setup", twin.status());
  auto reader = sim::TraceReader::Open(s->trace);
  if (!reader.ok()) return SimFail("--trace", reader.status());
  (*reader)->OmitFirstVisits(options.history_sketch);
  TraceSource source{.reader = std::move(*reader)};
  if (absl::Status st = (*twin)->Start(source.Next()); !st.ok()) return SimFail("run", st);
  const sim::OracleOptions o{.window = s->workload.window,
                             .slo = absl::Microseconds(static_cast<int64_t>(s->slo_ms * 1e3))};
  const bool star = f.follow == "star";
  std::printf(
      "sim oracle: %s, %u nodes, router %s, costs %s, window %s, SLO %.1f ms; the parent "
      "follows %s\n",
      f.trace.c_str(), f.nodes, f.router.c_str(), f.costs.c_str(),
      absl::FormatDuration(o.window).c_str(), s->slo_ms,
      star ? "alpha*" : absl::StrFormat("a static alpha %.2f", f.alpha).c_str());
  std::printf("%6s %9s %8s %10s %9s %7s\n", "window", "requests", "alpha*", "reward*", "unimodal",
              "points");
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<sim::WindowOracle>> result = sim::WindowAlphaStar(
      **twin, o, [&](uint64_t, double alpha_star) { return star ? alpha_star : f.alpha; });
  if (!result.ok()) return SimFail("oracle", result.status());
  if (absl::Status st = (*twin)->Finish(); !st.ok()) return SimFail("run", st);
  if (!source.error.ok()) return SimFail("--trace", source.error);
  std::string csv =
      "window,requests,alpha_star,reward_star,alpha_followed,reward_followed,unimodal,curve\n";
  double sum = 0;
  int counted = 0, unimodal = 0;
  for (const sim::WindowOracle& w : *result) {
    const absl::Duration from = o.window * static_cast<int64_t>(w.window);
    uint64_t requests = 0;
    for (const sim::TwinOutcome& out : (*twin)->outcomes()) {
      const absl::Duration t = absl::Nanoseconds(static_cast<int64_t>(out.sent_ns));
      requests += t >= from && t < from + o.window;
    }
    if (requests == 0) continue;  // after the trace's end
    const double followed = sim::WindowReward((*twin)->outcomes(), from, from + o.window, o.slo);
    std::printf("%6llu %9llu %8.2f %10.4f %9s %7zu\n", static_cast<unsigned long long>(w.window),
                static_cast<unsigned long long>(requests), w.alpha_star, w.reward_star,
                w.unimodal ? "yes" : "no", w.curve.size());
    std::string curve;
    for (const sim::CurvePoint& p : w.curve) {
      absl::StrAppendFormat(&curve, "%s%.2f:%.4f:%.2f", curve.empty() ? "" : " ", p.alpha, p.reward,
                            p.p99_ms);
    }
    absl::StrAppendFormat(&csv, "%d,%d,%.2f,%.4f,%.2f,%.4f,%d,%s\n", w.window, requests,
                          w.alpha_star, w.reward_star, w.alpha_followed, followed, w.unimodal,
                          curve);
    sum += w.alpha_star;
    ++counted;
    unimodal += w.unimodal;
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%d windows: mean alpha* %.3f, %d unimodal on the coarse grid; %.1f s of wall time\n",
              counted, counted > 0 ? sum / counted : 0.0, unimodal, wall);
  return WriteFile(f.csv, csv);
}

// The per-request CSV of `hlem loadgen --csv` or `hlem sim run --csv` (OutcomesCsv), as outcomes:
// times, latency and code always; node time and stage timings where the file has their columns
// (found by name: older files lack some).
absl::StatusOr<std::vector<loadgen::Outcome>> ReadOutcomes(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string line;
  if (!std::getline(in, line) || line.rfind("index,scheduled_s,sent_s,latency_ms,", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a per-request outcome CSV"));
  }
  const std::vector<std::string> header = absl::StrSplit(line, ',');
  auto column = [&](absl::string_view name) {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? -1 : static_cast<int>(it - header.begin());
  };
  const int code_col = column("code");
  if (code_col < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no code column"));
  struct Ms {
    int col;
    uint64_t loadgen::Outcome::*plain;
    uint64_t loadgen::Outcome::Stages::*stage;
  };
  const std::vector<Ms> ms = {
      {column("node_ms"), &loadgen::Outcome::node_ns, nullptr},
      {column("queue_ms"), nullptr, &loadgen::Outcome::Stages::queue_ns},
      {column("lookup_ms"), nullptr, &loadgen::Outcome::Stages::lookup_ns},
      {column("fetch_ms"), nullptr, &loadgen::Outcome::Stages::fetch_ns},
      {column("copy_ms"), nullptr, &loadgen::Outcome::Stages::copy_ns},
      {column("compute_ms"), nullptr, &loadgen::Outcome::Stages::compute_ns},
      {column("kv_ms"), nullptr, &loadgen::Outcome::Stages::kv_ns}};
  std::vector<loadgen::Outcome> out;
  for (size_t n = 2; std::getline(in, line); ++n) {
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": malformed ", what));
    };
    double scheduled = 0, sent = 0, latency = 0;
    uint64_t index = 0;
    if (f.size() < header.size() || !absl::SimpleAtoi(f[0], &index) ||
        !absl::SimpleAtod(f[1], &scheduled) || !absl::SimpleAtod(f[2], &sent) ||
        !absl::SimpleAtod(f[3], &latency)) {
      return bad("row");
    }
    loadgen::Outcome o{
        .index = index,
        .scheduled_ns = static_cast<uint64_t>(std::llround(scheduled * 1e9)),
        .sent_ns = static_cast<uint64_t>(std::llround(sent * 1e9)),
        .latency_ns = static_cast<uint64_t>(std::llround(latency * 1e6)),
        .code = f[code_col] == "OK" ? 0 : static_cast<int>(absl::StatusCode::kUnknown),
        .sent = true};
    for (const Ms& m : ms) {
      if (m.col < 0) continue;
      double v = 0;
      if (!absl::SimpleAtod(f[m.col], &v) || !(v >= 0)) return bad(header[m.col]);
      const auto ns = static_cast<uint64_t>(std::llround(v * 1e6));
      if (m.plain != nullptr) o.*m.plain = ns;
      if (m.stage != nullptr) o.stages.*m.stage = ns;
    }
    out.push_back(std::move(o));
  }
  return out;
}

// A real run's outcome as the twin's (what the fit compares).
sim::TwinOutcome AsTwinOutcome(const loadgen::Outcome& o) {
  return {.index = o.index,
          .sent_ns = o.scheduled_ns,
          .latency_ns = o.latency_ns,
          .node_ns = o.node_ns,
          .queue_ns = o.stages.queue_ns,
          .lookup_ns = o.stages.lookup_ns,
          .fetch_ns = o.stages.fetch_ns,
          .copy_ns = o.stages.copy_ns,
          .compute_ns = o.stages.compute_ns,
          .kv_ns = o.stages.kv_ns,
          .code = o.code == 0 ? absl::StatusCode::kOk : absl::StatusCode::kUnknown,
          .answered = true};
}

// The CPU seconds of a run (scripts/alpha-sweep.sh's <run>.cpu: "process cpu_s" rows), summed.
absl::StatusOr<double> ReadCpuSeconds(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string line;
  double total = 0;
  int rows = 0;
  for (size_t n = 1; std::getline(in, line); ++n) {
    const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (n == 1 && f.size() == 2 && f[0] == "process") continue;  // the header
    double s = 0;
    if (f.size() != 2 || !absl::SimpleAtod(f[1], &s) || !(s >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", n, ": expected '<process> <cpu seconds>'"));
    }
    total += s;
    ++rows;
  }
  if (rows == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no processes"));
  return total;
}

struct FitFlags {
  SimFlags sim;
  std::string real, out, cpu;
  int max_iterations = 8, slowdown_quantiles = 0, latency_rounds = 0;
};

std::string StageLine(const char* name, const sim::StageMedians& m) {
  return absl::StrFormat("%-7s %8llu %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f\n", name,
                         static_cast<unsigned long long>(m.requests), m.hop_ms, m.queue_ms,
                         m.lookup_ms, m.fetch_ms, m.copy_ms, m.compute_ms, m.latency_ms);
}

// Fits the cost model to a real run's per-stage timings (sim/twin/fit.h).
int Fit(const FitFlags& f) {
  if (f.latency_rounds > 0 && f.slowdown_quantiles == 0) {
    return SimFail("--latency-rounds", absl::InvalidArgumentError(
                                           "it reshapes the slowdown: give --slowdown-quantiles"));
  }
  absl::StatusOr<SimSetup> s = Prepare(f.sim);
  if (!s.ok()) return SimFail("setup", s.status());
  absl::StatusOr<std::vector<loadgen::Outcome>> real = ReadOutcomes(f.real);
  if (!real.ok()) return SimFail("--real", real.status());
  std::vector<sim::TwinOutcome> real_twin;
  for (const loadgen::Outcome& o : *real) real_twin.push_back(AsTwinOutcome(o));
  const sim::StageMedians real_medians = sim::MedianStages(real_twin, s->warmup_ns);
  if (real_medians.compute_ms <= 0) {
    return SimFail("--real", absl::InvalidArgumentError(
                                 "no stage timings (compute_ms is zero or missing): a CSV of "
                                 "`hlem loadgen --csv` from this version is needed"));
  }
  std::printf("sim fit: %s against %s, alpha %.2f, %u nodes, start %s\n", f.real.c_str(),
              f.sim.trace.c_str(), f.sim.alpha, f.sim.nodes, f.sim.costs.c_str());
  std::printf("medians (ms) %8s %8s %8s %8s %8s %8s %8s %8s\n", "requests", "hop", "queue",
              "lookup", "fetch", "copy", "compute", "latency");
  std::printf("%s", StageLine("real", real_medians).c_str());
  int iteration = 0;
  auto simulate = [&](const sim::CostModel& costs) -> absl::StatusOr<sim::SimulatedRun> {
    SimSetup run = *s;
    run.twin.costs = costs;
    absl::StatusOr<std::unique_ptr<sim::Twin>> twin = RunTwin(run, f.sim.alpha);
    if (!twin.ok()) return twin.status();
    sim::SimulatedRun out{.outcomes = (*twin)->outcomes(), .stats = (*twin)->stats()};
    const double cpu = absl::ToDoubleSeconds(out.stats.node_cpu + out.stats.background) * 1e3 /
                       static_cast<double>(std::max<uint64_t>(1, out.stats.requests));
    std::string line = StageLine(absl::StrCat("twin ", iteration++).c_str(),
                                 sim::MedianStages(out.outcomes, s->warmup_ns));
    line.pop_back();  // the newline
    std::printf("%s   cpu/request %.3f ms (background %.3f)\n", line.c_str(), cpu,
                absl::ToDoubleMilliseconds(costs.background_cpu));
    std::fflush(stdout);
    return out;
  };
  double real_cpu = 0;  // per request, seconds
  if (!f.cpu.empty()) {
    absl::StatusOr<double> total = ReadCpuSeconds(f.cpu);
    if (!total.ok()) return SimFail("--cpu", total.status());
    real_cpu = *total / static_cast<double>(real->size());
    std::printf("real cpu/request %.3f ms (%s: %.1f s over %zu requests)\n", real_cpu * 1e3,
                f.cpu.c_str(), *total, real->size());
  }
  absl::StatusOr<sim::FitResult> fit =
      sim::FitCosts(s->twin.costs, real_twin, s->warmup_ns, simulate,
                    {.max_iterations = f.max_iterations,
                     .real_cpu_per_request = real_cpu,
                     .slowdown_quantiles = f.slowdown_quantiles,
                     .latency_rounds = f.latency_rounds});
  if (!fit.ok()) return SimFail("fit", fit.status());
  sim::CostModel costs = fit->costs;
  std::string rounds;  // the latency rounds' distances, in order
  for (const sim::FitIteration& it : fit->iterations) {
    if (it.distance >= 0) absl::StrAppendFormat(&rounds, " %.4f", it.distance);
  }
  if (!rounds.empty()) {
    std::printf("latency rounds: KS distance to the real run%s; kept %.4f\n", rounds.c_str(),
                fit->distance);
  }
  costs.source = absl::StrFormat(
      "hlem sim fit --real %s (%d OK answers after %.0f s of warm-up) --trace %s --alpha %.2f "
      "--nodes %u%s, from %s; stage medians matched to %.1f %% (hop, lookup, fetch, compute)%s",
      f.real, real_medians.requests, f.sim.warmup_s, f.sim.trace, f.sim.alpha, f.sim.nodes,
      absl::StrCat(
          f.cpu.empty() ? "" : absl::StrCat(" --cpu ", f.cpu),
          f.slowdown_quantiles > 0 ? absl::StrCat(" --slowdown-quantiles ", f.slowdown_quantiles)
                                   : "",
          f.latency_rounds > 0 ? absl::StrCat(" --latency-rounds ", f.latency_rounds) : ""),
      f.sim.costs, 100 * fit->max_error,
      fit->distance >= 0
          ? absl::StrFormat("; latency distribution within %.4f (KS distance)", fit->distance)
          : "");
  std::printf("%s after %zu runs; largest stage error %.1f %%\n",
              fit->converged ? "converged" : "NOT converged", fit->iterations.size(),
              100 * fit->max_error);
  const std::string yaml =
      "# Fitted by `hlem sim fit` to a real run's per-stage timings (docs/simulator.md). Do not\n"
      "# edit by hand: re-run it.\n" +
      sim::CostModelYaml(costs);
  std::printf("%s", yaml.c_str());
  return WriteFile(f.out, yaml);
}

struct CompareFlags {
  std::string real, sim, real2;
  double slo_ms = 25, pool_s = 30, warmup_s = 0;
};

// Fidelity: the simulated run against the real one over pooled windows (and, given a second real
// run of the same trace, the real run-to-run spread beside it).
int Compare(const CompareFlags& f) {
  std::vector<std::vector<loadgen::Outcome>> runs;
  for (const std::string& path : {f.real, f.sim, f.real2}) {
    if (path.empty()) continue;
    absl::StatusOr<std::vector<loadgen::Outcome>> o = ReadOutcomes(path);
    if (!o.ok()) return SimFail(path, o.status());
    runs.push_back(std::move(*o));
  }
  const auto pool = static_cast<uint64_t>(f.pool_s * 1e9);
  const auto warmup = static_cast<uint64_t>(f.warmup_s * 1e9);
  std::vector<loadgen::Report> reports;
  for (const auto& r : runs) reports.push_back(loadgen::Summarize(r, pool, f.slo_ms, warmup));
  const bool spread = runs.size() == 3;
  std::printf("%-8s %8s | %8s %8s %7s | %8s %8s %7s | %7s %7s %6s%s\n", "pool", "requests",
              "real p50", "sim p50", "err", "real p99", "sim p99", "err", "real SLO", "sim SLO",
              "diff", spread ? " | real2 p50  p99 err   SLO diff" : "");
  auto row = [&](const char* name, const loadgen::Summary& a, const loadgen::Summary& b,
                 const loadgen::Summary* c) {
    auto rel = [](double x, double y) { return y > 0 ? 100 * (x - y) / y : 0.0; };
    std::printf("%-8s %8llu | %8.2f %8.2f %6.1f%% | %8.2f %8.2f %6.1f%% | %6.2f%% %6.2f%% %+6.2f",
                name, static_cast<unsigned long long>(a.requests), a.p50_ms, b.p50_ms,
                rel(b.p50_ms, a.p50_ms), a.p99_ms, b.p99_ms, rel(b.p99_ms, a.p99_ms),
                100 * a.slo_satisfaction, 100 * b.slo_satisfaction,
                100 * (b.slo_satisfaction - a.slo_satisfaction));
    if (c != nullptr) {
      std::printf(" | %8.2f %7.2f %5.1f%% %+6.2f", c->p50_ms, c->p99_ms, rel(c->p99_ms, a.p99_ms),
                  100 * (c->slo_satisfaction - a.slo_satisfaction));
    }
    std::printf("\n");
  };
  for (size_t w = 0; w < reports[0].windows.size() && w < reports[1].windows.size(); ++w) {
    if (static_cast<uint64_t>(w + 1) * pool <= warmup) continue;  // inside the warm-up
    row(absl::StrCat(w * static_cast<size_t>(f.pool_s), "s").c_str(), reports[0].windows[w],
        reports[1].windows[w],
        spread && w < reports[2].windows.size() ? &reports[2].windows[w] : nullptr);
  }
  row("overall", reports[0].overall, reports[1].overall, spread ? &reports[2].overall : nullptr);
  return 0;
}

void CommonFlags(CLI::App* cmd, SimFlags* f) {
  cmd->add_option("--trace", f->trace, "trace file (hlem workload generate)")->required();
  cmd->add_option("--node-config", f->node_config, "the nodes' config (deploy/local/node.yaml)");
  cmd->add_option("--costs", f->costs, "cost model file (sim/costs/*.yaml)");
  cmd->add_option("--nodes", f->nodes, "serving nodes")->check(CLI::Range(1u, 4096u));
  cmd->add_option("--router", f->router,
                  "routing policy: hlem, round_robin, least_loaded, user_hash, kv_only, emb_only");
  cmd->add_option("--slo-ms", f->slo_ms, "latency SLO (default: the node config's)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--emb-sample", f->emb_sample,
                  "EMB cache tracks 1 in N rows (hash-sampled; paper scale; 1 = every row)")
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_flag("--history-sketch", f->history_sketch,
                "first visits' histories sketched, not drawn row by row (needs --emb-sample >= 2; "
                "docs/simulator.md)");
  cmd->add_option("--calibrate-costs", f->calibrate_costs,
                  "the router learns its weights from the answers as the router binary does by "
                  "default (the KV, EMB and load costs in seconds; router/core/calibration.h); "
                  "false: the configured weights");
  cmd->add_option("--warmup-s", f->warmup_s,
                  "leave the trace's first N seconds out of the overall figures")
      ->check(CLI::NonNegativeNumber);
}

}  // namespace

void RegisterSimCommands(CLI::App& app, Run* run) {
  CLI::App* sim = app.add_subcommand("sim", "the digital twin: replay a trace in simulation");
  sim->require_subcommand(1);
  auto r = std::make_shared<SimFlags>();
  CLI::App* run_cmd = sim->add_subcommand("run", "replay a trace at one static α");
  CommonFlags(run_cmd, r.get());
  run_cmd->add_option("--alpha", r->alpha, "every node's α (EMB share of the pool)")
      ->check(CLI::Range(0.0, 1.0));
  run_cmd->add_option("--csv", r->csv, "write one row per request here");
  run_cmd
      ->add_option("--controller", r->controller,
                   "static (α fixed) or a controller deciding every window per node from "
                   "--alpha: hlem (SmartAllocator: PPO + online adapter + recovery), ppo, "
                   "ppo+adapter, ppo+recovery, kv_only, recovery (around the static α), and the "
                   "baselines pid, bo, milp, xgboost, lstm")
      ->check(CLI::IsMember(std::vector<std::string>(allocator::kControllerNames.begin(),
                                                     allocator::kControllerNames.end())));
  run_cmd->add_option("--weights", r->weights,
                      "the PPO actor of hlem and ppo* (hlem train-ppo --out; "
                      "allocator_service/policies/)");
  run_cmd->add_option("--deadband", r->deadband, allocator::kDeadbandHelp)
      ->check(CLI::Range(0.0, 1.0));
  run_cmd->add_option("--windows-csv", r->windows_csv, "write one row per window here");
  run_cmd->add_option("--faults", r->faults,
                      "kill and restart nodes, the allocator or embedding shards during the "
                      "replay: a plan (kill:1@5s,restart:1@7s,kill:allocator@10s,"
                      "restart:allocator@20s,kill:shard0@3s,restart:shard0@6s,stop:shard1@8s,"
                      "cont:shard1@12s; nodes and shards from 0, the shards of --node-config) or "
                      "random:SEED:KILLS[:SHARD_FAULTS]; the run prints the plan, which replays "
                      "exactly");
  run_cmd
      ->add_option("--fault-detection-s", r->fault_detection_s,
                   "how long the router takes to notice a dead node (its health checks)")
      ->check(CLI::Range(0.0, 600.0));
  run_cmd
      ->add_option("--deadline-ms", r->deadline_ms,
                   "every request's deadline, as the load generator's (the client, the node's "
                   "queue and pipeline and the shard fetches enforce it as the real ones do)")
      ->check(CLI::Range(1.0, 3.6e6));
  run_cmd->add_option("--decisions-csv", r->decisions_csv,
                      "write the controller's decisions here (window, node, alpha, reason; the "
                      "alpha is in force from the next window on)");
  run_cmd->callback([=] { *run = [=] { return RunSim(*r); }; });

  auto s = std::make_shared<SimFlags>();
  CLI::App* sweep = sim->add_subcommand("sweep", "one run per static α; the best α on the grid");
  CommonFlags(sweep, s.get());
  sweep->add_option("--alphas", s->alphas,
                    "α values, comma or space separated (default: 0, 0.02, ..., 1)");
  sweep->add_option("--csv", s->csv, "write one row per α here");
  sweep->callback([=] { *run = [=] { return Sweep(*s); }; });

  auto o = std::make_shared<SimFlags>();
  CLI::App* oracle = sim->add_subcommand(
      "oracle", "the offline-optimal alpha* of every decision window (forked snapshots)");
  CommonFlags(oracle, o.get());
  oracle
      ->add_option("--follow", o->follow,
                   "what the run applies between the forks: star (alpha* of each window) or "
                   "static (--alpha)")
      ->check(CLI::IsMember({"star", "static"}));
  oracle->add_option("--alpha", o->alpha, "the starting alpha (and the static one)")
      ->check(CLI::Range(0.0, 1.0));
  oracle->add_option("--csv", o->csv,
                     "write one row per window here (with its curve: alpha:reward:p99_ms ...)");
  oracle->callback([=] { *run = [=] { return Oracle(*o); }; });

  auto fit = std::make_shared<FitFlags>();
  CLI::App* fit_cmd = sim->add_subcommand(
      "fit",
      "fit the cost model to a real run's stage timings (hlem loadgen --csv) by replaying "
      "its trace");
  CommonFlags(fit_cmd, &fit->sim);
  fit_cmd->add_option("--real", fit->real, "hlem loadgen --csv of the real run")->required();
  fit_cmd->add_option("--alpha", fit->sim.alpha, "the α the real run's nodes had")
      ->check(CLI::Range(0.0, 1.0));
  fit_cmd->add_option("--out", fit->out, "write the fitted cost model here (YAML)");
  fit_cmd
      ->add_option("--slowdown-quantiles", fit->slowdown_quantiles,
                   "fit the per-request slowdown of the CPU stages as this many quantiles "
                   "(0: none)")
      ->check(CLI::Range(0, 1000));
  fit_cmd
      ->add_option("--latency-rounds", fit->latency_rounds,
                   "then reshape the slowdown quantiles until the twin's latency distribution "
                   "matches the real run's: at most this many twin runs (0: none)")
      ->check(CLI::Range(0, 50));
  fit_cmd->add_option("--cpu", fit->cpu,
                      "CPU seconds per process of the real run (scripts/alpha-sweep.sh's .cpu "
                      "file): fits background_cpu so the twin's cores are as busy");
  fit_cmd->add_option("--max-iterations", fit->max_iterations, "twin runs at most")
      ->check(CLI::Range(1, 50));
  fit_cmd->callback([=] { *run = [=] { return Fit(*fit); }; });

  auto c = std::make_shared<CompareFlags>();
  CLI::App* compare = sim->add_subcommand(
      "compare", "fidelity: a simulated run against a real one (per-request CSVs), pooled windows");
  compare->add_option("--real", c->real, "hlem loadgen --csv of the real run")->required();
  compare->add_option("--sim", c->sim, "hlem sim run --csv of the same trace")->required();
  compare->add_option("--real2", c->real2, "a second real run of the trace (run-to-run spread)");
  compare->add_option("--slo-ms", c->slo_ms, "latency SLO")->check(CLI::PositiveNumber);
  compare->add_option("--pool-s", c->pool_s, "pool requests over windows of this length")
      ->check(CLI::PositiveNumber);
  compare->add_option("--warmup-s", c->warmup_s, "leave the first N seconds out")
      ->check(CLI::NonNegativeNumber);
  compare->callback([=] { *run = [=] { return Compare(*c); }; });
}

}  // namespace hlem::tools
