// Experiments 3 and 4 of issue 8: every controller tracked against α*_t (ARCHITECTURE §8) in the
// twin. A tracked run (sim::TrackControlled) searches α*_t in forked children at the start of each
// window from the controller's own state, then lets the controller decide: the gap is the mean
// over nodes and windows of |α_n,t − α*_t|. Experiment 3 (`tracking`) shows the SmartAllocator's
// α against α*_t over time; experiment 4 (`controllers`) compares every controller's gap, P99,
// SLO satisfaction and decision latency. Both read the same cached runs.

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "allocator_service/core/registry.h"
#include "common/status_macros.h"
#include "tools/eval/eval.h"
#include "tools/eval/experiments.h"
#include "tools/sim_runner.h"

namespace hlem::eval {
namespace {

namespace fs = std::filesystem;

constexpr double kStartAlpha = 0.5;  // where every controller starts (and the static one stays)

// The α*_t search of ARCHITECTURE §8 (0.1, then 0.02, then 0.01 around the best); a quick run
// searches 0.25 then 0.125.
sim::OracleOptions Search(const Profile& p, bool quick) {
  sim::OracleOptions o;
  o.parallel = 1;  // the runs themselves are spread over --jobs
  o.search_every = p.search_every;
  if (quick) {
    o.coarse_step = 0.25;
    o.fine_step = o.finest_step = 0.125;
  }
  return o;
}

// One tracked window, as a task writes it.
struct WindowRow {
  double start_s = 0, alpha_star = 0, reward_star = 0, reward = 0, alpha_mean = 0, alpha_min = 0,
         alpha_max = 0, gap = 0, requests = 0, unimodal = 0, p99_star_ms = 0, p99_ms = 0,
         decided = 0;  // what chose α*: 0 the reward, 1 the P99 among tied rewards, 2 a full tie
  static constexpr size_t kFields = 13;
  static constexpr char kCsvColumns[] =
      "start_s,alpha_star,reward_star,reward,alpha_mean,alpha_min,alpha_max,gap,requests,unimodal,"
      "p99_star_ms,p99_ms,decided";
  std::string Format() const {
    return FormatNumbers({start_s, alpha_star, reward_star, reward, alpha_mean, alpha_min,
                          alpha_max, gap, requests, unimodal, p99_star_ms, p99_ms, decided});
  }
};

// A tracked run: the run's figures, its decision latencies, its windows.
struct TrackedRun {
  Figures figures;
  double decide_median_us = 0, decide_p99_us = 0, decisions = 0;
  std::vector<WindowRow> windows;
  double MeanGap() const {
    double sum = 0;
    for (const WindowRow& w : windows) sum += w.gap;
    return windows.empty() ? 0 : sum / static_cast<double>(windows.size());
  }
  // Mean over windows of the reward α*_t would have had minus the controller's (per-window
  // regret against the greedy α* from the controller's own state).
  double MeanRegret() const {
    double sum = 0;
    for (const WindowRow& w : windows) sum += w.reward_star - w.reward;
    return windows.empty() ? 0 : sum / static_cast<double>(windows.size());
  }
  std::string Format() const {
    std::string out = absl::StrCat(figures.Format(), "\n",
                                   FormatNumbers({decide_median_us, decide_p99_us, decisions}));
    for (const WindowRow& w : windows) absl::StrAppend(&out, "\n", w.Format());
    return out;
  }
  static absl::StatusOr<TrackedRun> Parse(const std::string& text) {
    const std::vector<std::string> lines = absl::StrSplit(text, '\n');
    if (lines.size() < 2) return absl::InternalError("a tracked run's output is too short");
    TrackedRun r;
    ASSIGN_OR_RETURN(r.figures, Figures::Parse(lines[0]));
    ASSIGN_OR_RETURN(const std::vector<double> d, ParseNumbers(lines[1], 3));
    r.decide_median_us = d[0];
    r.decide_p99_us = d[1];
    r.decisions = d[2];
    for (size_t i = 2; i < lines.size(); ++i) {
      ASSIGN_OR_RETURN(const std::vector<double> v, ParseNumbers(lines[i], WindowRow::kFields));
      r.windows.push_back(
          {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11], v[12]});
    }
    return r;
  }
};

// What decided α* among the curve's points (sim::SearchAlphaStar's order): 0 a reward better than
// every other by more than the tie, 1 the lowest P99 among tied rewards, 2 a tie in both (α* is
// then the α the nodes ran: the window could not tell the candidates apart).
double Decided(const std::vector<sim::CurvePoint>& curve) {
  double top = -1e300, low = 1e300;
  for (const sim::CurvePoint& p : curve) top = std::max(top, p.reward);
  size_t near = 0, lowest = 0;
  for (const sim::CurvePoint& p : curve) {
    if (p.reward < top - sim::kRewardTie) continue;
    ++near;
    low = std::min(low, p.p99_ms);
  }
  for (const sim::CurvePoint& p : curve) {
    lowest += p.reward >= top - sim::kRewardTie && p.p99_ms <= low + 1e-9;
  }
  return near == 1 ? 0 : lowest == 1 ? 1 : 2;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const auto k = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// `controller` over the trace from α 0.5, tracked against α*_t; cached like the plain runs.
Task TrackedTask(const EvalOptions& o, const Stamp& stamp, const Profile& p,
                 const std::string& trace, const std::string& controller) {
  tools::SimSetupOptions run = SimOptions(o, p, trace, kStartAlpha);
  run.controller = {.name = controller, .alpha = kStartAlpha};
  if (controller.rfind("ppo", 0) == 0 || controller == "hlem") {
    run.controller.weights = (fs::path(o.repo) / p.policy).string();
  }
  sim::OracleOptions search = Search(p, o.quick);
  // Controllers that apply the same αs (a static α and a policy that holds it) share searches.
  std::tie(search.cache, search.cache_key) = SearchCacheFor(o, stamp, run, kStartAlpha);
  const std::string key =
      absl::StrCat(RunKey(run, kStartAlpha),
                   absl::StrFormat(" tracked=%.3f:%.3f:%.3f every=%d", search.coarse_step,
                                   search.fine_step, search.finest_step, search.search_every));
  return CachedRun(o, stamp, key, [run, search]() -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(tools::SimSetup setup, tools::PrepareSim(run));
    sim::OracleOptions track = search;
    track.window = setup.workload.window;
    track.slo = absl::Microseconds(static_cast<int64_t>(std::llround(setup.slo_ms * 1e3)));
    setup.track = track;
    ASSIGN_OR_RETURN(const tools::SimRunResult r, tools::RunOnce(setup, kStartAlpha));
    TrackedRun out{.figures = FiguresOf(setup, r)};
    std::vector<double> us;
    for (const sim::ControlRecord& d : r.decisions) us.push_back(d.decide_ns / 1e3);
    out.decide_median_us = Quantile(us, 0.5);
    out.decide_p99_us = Quantile(us, 0.99);
    out.decisions = static_cast<double>(us.size());
    const auto warmup = static_cast<double>(setup.warmup_ns) / 1e9;
    for (const sim::TrackedWindow& w : r.tracked) {
      // The figures leave the warm-up out; so does the gap.
      const double start_s = static_cast<double>(w.window) * absl::ToDoubleSeconds(track.window);
      if (start_s < warmup) continue;
      const auto [lo, hi] = std::minmax_element(w.alphas.begin(), w.alphas.end());
      double mean = 0;
      for (double a : w.alphas) mean += a / static_cast<double>(w.alphas.size());
      out.windows.push_back({.start_s = start_s,
                             .alpha_star = w.alpha_star,
                             .reward_star = w.reward_star,
                             .reward = w.reward,
                             .alpha_mean = mean,
                             .alpha_min = *lo,
                             .alpha_max = *hi,
                             .gap = w.gap,
                             .requests = static_cast<double>(w.requests),
                             .unimodal = w.unimodal ? 1.0 : 0.0,
                             .p99_star_ms = w.p99_star_ms,
                             .p99_ms = w.p99_ms,
                             .decided = Decided(w.curve)});
    }
    return out.Format();
  });
}

// The tracked runs of `controllers` on a trace per regime and seed:
// result[c][r][k] for controller c, regime r, seed k.
absl::StatusOr<std::vector<std::vector<std::vector<TrackedRun>>>> RunTracked(
    const EvalOptions& o, const Profile& p, Stamp& stamp,
    const std::vector<std::string>& controllers) {
  const size_t R = Regimes().size(), S = o.seeds.size();
  ASSIGN_OR_RETURN(const std::vector<std::string> traces, RegimeTraces(o, p, stamp));
  std::vector<Task> runs;
  for (const std::string& c : controllers) {
    for (const std::string& trace : traces) runs.push_back(TrackedTask(o, stamp, p, trace, c));
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> out,
                   RunExperimentRuns(o, traces.size(), runs, stamp));
  std::vector<std::vector<std::vector<TrackedRun>>> result(
      controllers.size(), std::vector<std::vector<TrackedRun>>(R, std::vector<TrackedRun>(S)));
  size_t next = 0;
  for (size_t c = 0; c < controllers.size(); ++c) {
    for (size_t r = 0; r < R; ++r) {
      for (size_t k = 0; k < S; ++k) {
        ASSIGN_OR_RETURN(result[c][r][k], TrackedRun::Parse(out[next++]));
      }
    }
  }
  return result;
}

std::string SearchLine(const Profile& p, bool quick) {
  const sim::OracleOptions s = Search(p, quick);
  return absl::StrFormat(
      "α\\*_t: the best cluster-wide α for window t, searched at the start of t from the "
      "controller's own state (its α_{t−1}, the caches it left, the refill a move starts) in "
      "forked copies of the twin that see the same requests: a grid of %.2f, then %.3f and %.3f "
      "around the best (the whole %.3f grid where the coarse curve is not unimodal); the reward "
      "of ARCHITECTURE §3 over the window's requests. *Gap*: the mean over nodes and windows "
      "(after the warm-up%s) of |α_n,t − α\\*_t|. *Regret*: the mean over windows of the reward "
      "at α\\*_t minus the controller's (against the greedy per-window α\\*, not the "
      "dynamic-programming trajectory of ARCHITECTURE §8, which is not computed).",
      s.coarse_step, s.fine_step, s.finest_step, s.fine_step,
      s.search_every > 1
          ? absl::StrFormat("; every %d-th window is searched, to bound the cost", s.search_every)
          : "");
}

// Mean and range over seeds.
struct Spread {
  double mean = 0, lo = 1e300, hi = -1e300;
  size_t n = 0;
  void Add(double v) {
    mean = (mean * static_cast<double>(n) + v) / static_cast<double>(n + 1);
    ++n;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  std::string Text(int digits) const {
    std::string out = absl::StrFormat("%.*f", digits, mean);
    if (n > 1) absl::StrAppendFormat(&out, " (%.*f–%.*f)", digits, lo, digits, hi);
    return out;
  }
};

}  // namespace

absl::Status Tracking(const EvalOptions& o, const Profile& p, Stamp& stamp) {
  ASSIGN_OR_RETURN(const auto runs, RunTracked(o, p, stamp, {"hlem"}));
  const size_t R = Regimes().size(), S = o.seeds.size();
  std::string csv = absl::StrCat(stamp.CsvComment(), "regime,seed,", WindowRow::kCsvColumns, "\n");
  std::string md = absl::StrCat(
      "# Tracking α\\* (experiment 3)\n\n", stamp.Markdown(),
      absl::StrFormat("\nThe SmartAllocator (`hlem`: `%s` + adapter + recovery, from α %.1f) on "
                      "every node, behind the KV–EMB-aware router. %s\n\n",
                      p.policy, kStartAlpha, SearchLine(p, o.quick)),
      "| regime | windows | gap | gap where the window told | regret | α\\* mean (min–max) | α "
      "mean | unimodal | window P99 "
      "at α\\* / HLEM ms | α\\* by reward / P99 / tie | P99 ms | SLO |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  // The plot: α* and the mean α per window, first seed, a block per regime.
  std::string dat;
  for (size_t r = 0; r < R; ++r) {
    Spread gap, regret, p99, slo;
    double windows = 0, unimodal = 0, star = 0, star_lo = 1, star_hi = 0, alpha = 0, p99_star = 0,
           p99_run = 0, by[3] = {0, 0, 0}, told_gap = 0;
    for (size_t k = 0; k < S; ++k) {
      const TrackedRun& t = runs[0][r][k];
      gap.Add(t.MeanGap());
      regret.Add(t.MeanRegret());
      p99.Add(t.figures.p99_ms);
      slo.Add(100 * t.figures.slo);
      for (const WindowRow& w : t.windows) {
        absl::StrAppendFormat(&csv, "%s,%d,%s\n", sim::RegimeName(Regimes()[r]), o.seeds[k],
                              w.Format());
        windows += 1;
        unimodal += w.unimodal;
        star += w.alpha_star;
        alpha += w.alpha_mean;
        p99_star += w.p99_star_ms;
        p99_run += w.p99_ms;
        by[static_cast<int>(w.decided)] += 1;
        if (w.decided < 2) told_gap += w.gap;
        star_lo = std::min(star_lo, w.alpha_star);
        star_hi = std::max(star_hi, w.alpha_star);
        if (k == 0) {
          absl::StrAppendFormat(&dat, "%.1f %.4f %.4f\n", w.start_s, w.alpha_star, w.alpha_mean);
        }
      }
    }
    absl::StrAppend(&dat, "\n\n");
    const double nw = std::max(windows, 1.0);
    const double told_n = by[0] + by[1];
    const std::string told = told_n > 0 ? absl::StrFormat("%.3f (%.0f)", told_gap / told_n, told_n)
                                        : std::string("— (0)");
    absl::StrAppendFormat(
        &md,
        "| %s | %.0f | %s | %s | %s | %.3f (%.2f–%.2f) | %.3f | %.0f %% | %.2f / %.2f "
        "| %.0f / %.0f / %.0f %% | %s | %s %% |\n",
        sim::RegimeName(Regimes()[r]), windows, gap.Text(3), told, regret.Text(4), star / nw,
        star_lo, star_hi, alpha / nw, 100 * unimodal / nw, p99_star / nw, p99_run / nw,
        100 * by[0] / nw, 100 * by[1] / nw, 100 * by[2] / nw, p99.Text(2), slo.Text(2));
  }
  absl::StrAppend(&md,
                  "\nTarget (ARCHITECTURE §12): gap ≤ 0.02 in every regime (the paper: 0.024–"
                  "0.029). *Unimodal*: the windows whose coarse reward curve had one maximum. "
                  "Files: `tracking.csv` (every window of every seed), `tracking.png` (α\\*_t and "
                  "the nodes' mean α over time, first seed).\n");
  RETURN_IF_ERROR(WriteOutput(o, "tracking.csv", csv));
  RETURN_IF_ERROR(WriteOutput(o, "tracking.md", md));
  const fs::path data = fs::path(o.work_dir) / "plots" / "tracking.dat";
  RETURN_IF_ERROR(WriteFileAtomically(data, dat));
  std::string script = absl::StrFormat(
      "set title 'SmartAllocator α vs α* — %s profile (%s)'\nset xlabel 'time (s)'\nset ylabel "
      "'α'\nset yrange [0:1]\nset grid\nset key outside right\nplot ",
      p.name, stamp.commit);
  const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c"};
  for (size_t r = 0; r < R; ++r) {
    absl::StrAppendFormat(&script,
                          "%s'%s' index %d using 1:2 with steps lc rgb '%s' dt 2 title '%s α*', "
                          "'' index %d using 1:3 with steps lc rgb '%s' lw 2 title '%s HLEM'",
                          r == 0 ? "" : ", ", data.string(), r, colours[r],
                          sim::RegimeName(Regimes()[r]), r, colours[r],
                          sim::RegimeName(Regimes()[r]));
  }
  absl::StrAppend(&script, "\n");
  return Plot(script, (fs::path(o.out_dir) / "tracking.png").string(), o.work_dir);
}

absl::Status Controllers(const EvalOptions& o, const Profile& p, Stamp& stamp) {
  // The controllers asked for (every one of the registry by default) that can be made here (the
  // LSTM needs its plugin).
  for (const std::string& name : o.controllers) {
    if (std::find(allocator::kControllerNames.begin(), allocator::kControllerNames.end(), name) ==
        allocator::kControllerNames.end()) {
      std::string known;
      for (std::string_view n : allocator::kControllerNames) {
        absl::StrAppend(&known, known.empty() ? "" : ", ", std::string(n));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--controllers: no controller '", name, "' (known: ", known, ")"));
    }
  }
  std::vector<std::string> names;
  std::string missing;
  for (std::string_view name : allocator::kControllerNames) {
    if (!o.controllers.empty() &&
        std::find(o.controllers.begin(), o.controllers.end(), name) == o.controllers.end()) {
      continue;
    }
    allocator::ControllerSpec spec{.name = std::string(name), .alpha = kStartAlpha};
    if (name.rfind("ppo", 0) == 0 || name == "hlem") {
      spec.weights = (fs::path(o.repo) / p.policy).string();
    }
    if (absl::StatusOr<allocator::ControllerFactory> f = allocator::MakeControllerFactory(spec);
        f.ok()) {
      names.emplace_back(name);
    } else {
      absl::StrAppend(&missing, "\n- `", std::string(name),
                      "` left out: ", std::string(f.status().message()));
    }
  }
  ASSIGN_OR_RETURN(const auto runs, RunTracked(o, p, stamp, names));
  const size_t R = Regimes().size(), S = o.seeds.size();
  std::string csv =
      absl::StrCat(stamp.CsvComment(), "controller,regime,seed,", Figures::kCsvColumns,
                   ",gap,regret,windows,decisions,decide_median_us,decide_p99_us\n");
  std::string md = absl::StrCat(
      "# Controllers (experiment 4)\n\n", stamp.Markdown(),
      absl::StrFormat("\nEvery controller of `allocator_service/core/registry.h` on every node, "
                      "from α %.1f (`static` stays there; `recovery` guards it), behind the "
                      "KV–EMB-aware router; the PPO-based ones with `%s`. %s\n\n",
                      kStartAlpha, p.policy, SearchLine(p, o.quick)));
  std::string header = "| controller |", rule = "|---|";
  for (sim::Regime regime : Regimes()) {
    absl::StrAppend(&header, " ", sim::RegimeName(regime), ": gap / P99 ms / SLO |");
    absl::StrAppend(&rule, "---|");
  }
  absl::StrAppend(&md, header, " decision µs median (p99) |\n", rule, "---|\n");
  std::string dat = "controller";
  for (sim::Regime regime : Regimes()) absl::StrAppend(&dat, " ", sim::RegimeName(regime));
  absl::StrAppend(&dat, "\n");
  for (size_t c = 0; c < names.size(); ++c) {
    absl::StrAppend(&md, "| `", names[c], "` |");
    absl::StrAppend(&dat, "\"", names[c], "\"");
    std::vector<double> median, p99s;
    for (size_t r = 0; r < R; ++r) {
      Spread gap, p99, slo;
      for (size_t k = 0; k < S; ++k) {
        const TrackedRun& t = runs[c][r][k];
        gap.Add(t.MeanGap());
        p99.Add(t.figures.p99_ms);
        slo.Add(100 * t.figures.slo);
        median.push_back(t.decide_median_us);
        p99s.push_back(t.decide_p99_us);
        absl::StrAppendFormat(
            &csv, "%s,%s,%d,%s,%s\n", names[c], sim::RegimeName(Regimes()[r]), o.seeds[k],
            t.figures.Format(),
            FormatNumbers({t.MeanGap(), t.MeanRegret(), static_cast<double>(t.windows.size()),
                           t.decisions, t.decide_median_us, t.decide_p99_us}));
      }
      absl::StrAppend(&md, " ", gap.Text(3), " / ", p99.Text(2), " / ", slo.Text(2), " % |");
      absl::StrAppendFormat(&dat, " %.4f", gap.mean);
    }
    absl::StrAppendFormat(&md, " %.1f (%.1f) |\n", Quantile(median, 0.5), Quantile(p99s, 0.5));
    absl::StrAppend(&dat, "\n");
  }
  absl::StrAppend(
      &md,
      "\nCells: the gap to α\\*, P99 and SLO satisfaction (mean over seeds; the range over seeds "
      "in brackets). *Decision*: the wall time of one `Decide` in the twin's process (the "
      "median over runs of each run's median and p99; the twin shares the core, so this is an "
      "upper bound of the service's figure, which `bench/allocator_benchmark.cc` measures alone). "
      "Targets (ARCHITECTURE §12): gap ≤ 0.02, decisions ≤ 3 µs.\n",
      missing.empty() ? "" : absl::StrCat("\nNot run:", missing, "\n"),
      "\nFiles: `controllers.csv` (every run), `controllers.png` (the gap per controller and "
      "regime).\n");
  return WriteBarChartResults(
      o, "controllers", csv, md, dat, R,
      absl::StrFormat("Gap to α* by controller — %s profile (%s)", p.name, stamp.commit),
      "mean |α − α*|");
}

}  // namespace hlem::eval
