// Experiment 7 of issue 8, scale: weak scaling of throughput with the cluster (the paper: 2 to 32
// hosts of 8 GPUs, 16 to 256 serving nodes; the load, the users and the hot users grow with the
// nodes, so every node sees the same share), and the α the SmartAllocator settles on against the
// hot-user ratio × the cluster size (a heatmap). HLEM throughout: the SmartAllocator on every
// node behind the KV–EMB-aware router, on Steady traces at each hot-user ratio.

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "tools/eval/eval.h"
#include "tools/eval/experiments.h"
#include "tools/sim_runner.h"

namespace hlem::eval {
namespace {

namespace fs = std::filesystem;

constexpr double kWeakRatio = 0.2;  // the hot-user ratio of the weak-scaling series (Steady's)

// What a scale run reports beyond its figures.
struct ScaleRun {
  Figures figures;
  double mean_alpha = 0;  // the SmartAllocator's α over the nodes' decisions after the warm-up
  double route_us = 0;    // wall time of one Route call of the real router code, mean
  double twin_rate = 0;   // requests simulated per second of wall time
  static absl::StatusOr<ScaleRun> Parse(const std::string& text) {
    const size_t nl = text.find('\n');
    if (nl == std::string::npos) return absl::InternalError("a scale run's output is too short");
    ScaleRun r;
    ASSIGN_OR_RETURN(r.figures, Figures::Parse(text.substr(0, nl)));
    ASSIGN_OR_RETURN(const std::vector<double> v, ParseNumbers(text.substr(nl + 1), 3));
    r.mean_alpha = v[0];
    r.route_us = v[1];
    r.twin_rate = v[2];
    return r;
  }
};

Task ScaleTask(const EvalOptions& o, const Stamp& stamp, const tools::SimSetupOptions& run) {
  return CachedRun(
      o, stamp, absl::StrCat(RunKey(run, 0.5), " scale"), [run]() -> absl::StatusOr<std::string> {
        ASSIGN_OR_RETURN(const tools::SimSetup setup, tools::PrepareSim(run));
        ASSIGN_OR_RETURN(const tools::SimRunResult r, tools::RunOnce(setup, 0.5));
        double sum = 0, n = 0;
        for (const sim::ControlRecord& d : r.decisions) {
          // Window w's decision holds from window w + 1 on.
          if (static_cast<double>((d.window + 1) * setup.window_ns) < setup.warmup_ns) continue;
          sum += d.alpha;
          n += 1;
        }
        const sim::TwinStats& t = r.stats;
        return absl::StrCat(
            FiguresOf(setup, r).Format(), "\n",
            FormatNumbers({n > 0 ? sum / n : 0.5,
                           t.route_calls > 0 ? 1e6 * t.route_wall_seconds / t.route_calls : 0,
                           t.wall_seconds > 0 ? t.requests / t.wall_seconds : 0}));
      });
}

}  // namespace

absl::Status Scale(const EvalOptions& o, const Profile& p, Stamp& stamp) {
  std::vector<uint32_t> sizes = o.sizes;
  if (sizes.empty()) {
    sizes = o.quick             ? std::vector<uint32_t>{2, 4}
            : p.name == "paper" ? std::vector<uint32_t>{16, 32, 64, 128, 256}
                                : std::vector<uint32_t>{4, 8, 16, 32};
  }
  const std::vector<double> ratios =
      o.quick ? std::vector<double>{0.2, 0.5} : std::vector<double>{0.1, 0.2, 0.3, 0.5};
  // Shorter traces than the other experiments': a 256-node trace holds 40 × 256 requests a second
  // (≈ 1 000 requests are simulated per second of wall time, ≈ 25 KB of memory each).
  Profile base = p;
  if (!o.quick) {
    base.duration_s = 45;
    base.warmup_s = 15;
  }
  const size_t N = sizes.size(), H = ratios.size(), S = o.seeds.size();
  {  // the stamp names the sizes and traces of this experiment, not the profile's defaults
    std::string list;
    for (uint32_t n : sizes) absl::StrAppend(&list, list.empty() ? "" : ", ", n);
    stamp.profile_line = absl::StrFormat(
        "%s (%s; %s nodes, %.0f requests/s per node, %.0f s traces, the first %.0f s left out)",
        p.name, p.note, list, p.rate_per_node, base.duration_s, base.warmup_s);
  }
  std::vector<Task> trace_tasks;
  std::vector<Profile> profiles;  // per size
  for (uint32_t n : sizes) {
    Profile q = base;
    q.nodes = n;
    profiles.push_back(q);
  }
  for (size_t i = 0; i < N; ++i) {
    for (double h : ratios) {
      for (uint64_t seed : o.seeds) {
        const Profile* q = &profiles[i];
        const double users = static_cast<double>(sizes[i]) / static_cast<double>(p.nodes);
        trace_tasks.push_back([&o, q, h, seed, users]() {
          return MakeTrace(
              o, *q,
              {.regime = sim::Regime::kSteady, .seed = seed, .hot_ratio = h, .users_scale = users});
        });
      }
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> traces,
                   RunParallel(trace_tasks, o.jobs, o.work_dir));
  std::vector<Task> runs;
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = 0; j < H * S; ++j) {
      tools::SimSetupOptions run = SimOptions(o, profiles[i], traces[i * H * S + j], 0.5);
      run.controller = {
          .name = "hlem", .weights = (fs::path(o.repo) / p.policy).string(), .alpha = 0.5};
      if (i == 0 && j == 0) {
        ASSIGN_OR_RETURN(const tools::SimSetup setup, tools::PrepareSim(run));
        stamp.device = setup.twin.costs.device;
      }
      runs.push_back(ScaleTask(o, stamp, run));
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> out,
                   RunExperimentRuns(o, traces.size(), runs, stamp));

  const double measured_s = base.duration_s - base.warmup_s;
  std::string csv = absl::StrCat(stamp.CsvComment(), "nodes,hot_ratio,seed,", Figures::kCsvColumns,
                                 ",offered_per_s,ok_per_s,efficiency,mean_alpha,route_us,"
                                 "twin_requests_per_wall_s\n");
  // [size][ratio]: means over seeds
  std::vector<std::vector<ScaleRun>> mean(N, std::vector<ScaleRun>(H));
  for (size_t i = 0; i < N; ++i) {
    for (size_t h = 0; h < H; ++h) {
      for (size_t k = 0; k < S; ++k) {
        ASSIGN_OR_RETURN(const ScaleRun r, ScaleRun::Parse(out[(i * H + h) * S + k]));
        const double offered = p.rate_per_node * sizes[i];
        const double ok_per_s = r.figures.ok / measured_s;
        absl::StrAppendFormat(&csv, "%d,%.2f,%d,%s,%s\n", sizes[i], ratios[h], o.seeds[k],
                              r.figures.Format(),
                              FormatNumbers({offered, ok_per_s, ok_per_s / offered, r.mean_alpha,
                                             r.route_us, r.twin_rate}));
        const double w = 1.0 / static_cast<double>(S);
        ScaleRun& m = mean[i][h];
        m.figures.ok += w * r.figures.ok;
        m.figures.p99_ms += w * r.figures.p99_ms;
        m.figures.slo += w * r.figures.slo;
        m.figures.kv_reuse += w * r.figures.kv_reuse;
        m.mean_alpha += w * r.mean_alpha;
        m.route_us += w * r.route_us;
        m.twin_rate += w * r.twin_rate;
      }
    }
  }
  const size_t weak =
      std::find(ratios.begin(), ratios.end(), kWeakRatio) - ratios.begin();  // in the grid
  const bool paper = p.name == "paper";
  std::string md = absl::StrCat(
      "# Scale (experiment 7)\n\n", stamp.Markdown(),
      absl::StrFormat(
          "\nHLEM (the SmartAllocator with `%s` from α 0.5 on every node, the KV–EMB-aware "
          "router) on Steady traces of %.0f s (the first %.0f s left out) at %.0f requests/s "
          "per node; the users and hot users grow with the nodes (×nodes ÷ %d of the profile's), "
          "so each node sees the same share. Mean over %d seed(s).\n\n## Weak scaling (hot-user "
          "ratio %.1f)\n\n| nodes |%s offered req/s | OK req/s | efficiency | P99 ms | SLO | KV "
          "reuse | route µs | twin req/s of wall |\n|---|%s---|---|---|---|---|---|---|---|\n",
          p.policy, base.duration_s, base.warmup_s, p.rate_per_node, p.nodes, S, kWeakRatio,
          paper ? " hosts |" : "", paper ? "---|" : ""));
  std::string dat_weak, dat_heat;
  for (size_t i = 0; i < N; ++i) {
    const ScaleRun& m = mean[i][weak];
    const double offered = p.rate_per_node * sizes[i];
    const double ok_per_s = m.figures.ok / measured_s;
    absl::StrAppendFormat(
        &md, "| %d |%s %.0f | %.1f | %.3f | %.2f | %.2f %% | %.1f %% | %.2f | %.0f |\n", sizes[i],
        paper ? absl::StrFormat(" %d |", sizes[i] / 8) : "", offered, ok_per_s, ok_per_s / offered,
        m.figures.p99_ms, 100 * m.figures.slo, 100 * m.figures.kv_reuse, m.route_us, m.twin_rate);
    absl::StrAppendFormat(&dat_weak, "%d %.4f %.4f\n", sizes[i], offered, ok_per_s);
  }
  absl::StrAppend(&md,
                  "\n## α chosen (mean over nodes and windows after the warm-up)\n\n| hot ratio |");
  for (uint32_t n : sizes) absl::StrAppendFormat(&md, " %d nodes |", n);
  absl::StrAppend(&md, "\n|---|");
  for (size_t i = 0; i < N; ++i) absl::StrAppend(&md, "---|");
  absl::StrAppend(&md, "\n");
  for (size_t h = 0; h < H; ++h) {
    absl::StrAppendFormat(&md, "| %.1f |", ratios[h]);
    for (size_t i = 0; i < N; ++i) {
      absl::StrAppendFormat(&md, " %.3f |", mean[i][h].mean_alpha);
      absl::StrAppendFormat(&dat_heat, "%d %.2f %.4f\n", i, ratios[h], mean[i][h].mean_alpha);
    }
    absl::StrAppend(&md, "\n");
    absl::StrAppend(&dat_heat, "\n");
  }
  absl::StrAppend(
      &md,
      "\n*Efficiency*: OK answers per second ÷ the offered load (1 = every request answered "
      "within the trace). *Route µs*: the wall time of the real router code's `Route` on this "
      "machine, per call (the twin charges the cost model's fixed router overhead; this column "
      "shows how the router's own work grows with the nodes it scores). Files: `scale.csv` "
      "(every run), `scale.png` (throughput against nodes; the α heatmap).\n");
  RETURN_IF_ERROR(WriteOutput(o, "scale.csv", csv));
  RETURN_IF_ERROR(WriteOutput(o, "scale.md", md));
  const fs::path weak_path = fs::path(o.work_dir) / "plots" / "scale-weak.dat";
  const fs::path heat_path = fs::path(o.work_dir) / "plots" / "scale-alpha.dat";
  RETURN_IF_ERROR(WriteFileAtomically(weak_path, dat_weak));
  RETURN_IF_ERROR(WriteFileAtomically(heat_path, dat_heat));
  std::string xtics;
  for (size_t i = 0; i < N; ++i) {
    absl::StrAppendFormat(&xtics, "%s'%d' %d", i == 0 ? "" : ", ", sizes[i], i);
  }
  const std::string script = absl::StrFormat(
      "set multiplot layout 1,2 title 'Scale — %s profile (%s)'\nset title 'Weak scaling (hot "
      "ratio %.1f)'\nset xlabel 'serving nodes'\nset ylabel 'requests/s'\nset logscale xy 2\n"
      "set grid\nset key top left\nplot '%s' using 1:2 with linespoints title 'offered', '' "
      "using 1:3 with linespoints title 'answered OK'\nunset logscale\nset title 'α chosen'\n"
      "set xlabel 'serving nodes'\nset ylabel 'hot-user ratio'\nset xtics (%s)\nset cbrange "
      "[0:1]\nset cblabel 'α'\nunset key\nplot '%s' using 1:2:3 with image\nunset multiplot\n",
      p.name, stamp.commit, kWeakRatio, weak_path.string(), xtics, heat_path.string());
  return Plot(script, (fs::path(o.out_dir) / "scale.png").string(), o.work_dir);
}

}  // namespace hlem::eval
