// Experiment 5 of issue 8, the ablations: what each part of HLEM adds. The system ladder starts
// from KV-EMB-Opt (the oracle static α behind KV-affinity routing), adds the SmartAllocator
// (still KV-affinity routing), then the KV–EMB-aware router (= HLEM). The controller ladder, behind
// the KV–EMB-aware router, starts from the frozen PPO policy alone and adds the online adapter,
// then the recovery controller (= the SmartAllocator); PPO + recovery without the adapter beside.

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

constexpr char kBaselineRouter[] = "kv_only";

// A rung of a ladder: a controller (from α 0.5) behind a router; "static" is the oracle static α.
struct Rung {
  std::string label, controller, router;
};

const std::vector<Rung>& Rungs() {
  static const std::vector<Rung>* rungs = new std::vector<Rung>{
      {"KV-EMB-Opt", "static", kBaselineRouter}, {"+SmartAllocator", "hlem", kBaselineRouter},
      {"+router (HLEM)", "hlem", "hlem"},        {"PPO-only", "ppo", "hlem"},
      {"PPO+adapter", "ppo+adapter", "hlem"},    {"PPO+adapter+recovery (HLEM)", "hlem", "hlem"},
      {"PPO+recovery", "ppo+recovery", "hlem"},
  };
  return *rungs;
}
constexpr size_t kSystemRungs = 3;  // the first ladder; the rest is the controller ladder

struct Mean {
  double p99 = 0, slo = 0, alpha = 0, p99_lo = 1e300, p99_hi = 0;
  void Add(const Figures& f, double a, double w) {
    p99 += w * f.p99_ms;
    slo += w * f.slo;
    alpha += w * a;
    p99_lo = std::min(p99_lo, f.p99_ms);
    p99_hi = std::max(p99_hi, f.p99_ms);
  }
};

}  // namespace

absl::Status Ablations(const EvalOptions& o, const Profile& p, Stamp& stamp) {
  const std::vector<double> grid = StaticGrid(o.quick);
  ASSIGN_OR_RETURN(const std::vector<std::string> traces, RegimeTraces(o, p, stamp));
  const size_t R = Regimes().size(), S = o.seeds.size(), G = grid.size(), N = Rungs().size();
  // Per trace: the grid behind the baseline router, then each rung but the first.
  std::vector<Task> runs;
  for (const std::string& trace : traces) {
    for (double alpha : grid) {
      tools::SimSetupOptions run = SimOptions(o, p, trace, alpha);
      run.router = kBaselineRouter;
      runs.push_back(FiguresTask(o, stamp, run, alpha));
    }
    for (size_t n = 1; n < N; ++n) {
      tools::SimSetupOptions run = SimOptions(o, p, trace, 0.5);
      run.router = Rungs()[n].router;
      run.controller = {.name = Rungs()[n].controller,
                        .weights = (fs::path(o.repo) / p.policy).string(),
                        .alpha = 0.5};
      runs.push_back(FiguresTask(o, stamp, run, 0.5));
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> rows,
                   RunExperimentRuns(o, traces.size(), runs, stamp));

  std::string csv = absl::StrCat(stamp.CsvComment(), "regime,seed,system,controller,router,alpha,",
                                 Figures::kCsvColumns, "\n");
  std::vector<std::vector<Mean>> mean(R, std::vector<Mean>(N));  // [regime][rung]
  size_t next = 0;
  for (size_t r = 0; r < R; ++r) {
    for (size_t k = 0; k < S; ++k) {
      const double w = 1.0 / static_cast<double>(S);
      std::vector<Figures> sweep(G);
      for (size_t g = 0; g < G; ++g) {
        ASSIGN_OR_RETURN(sweep[g], Figures::Parse(rows[next]));
        absl::StrAppendFormat(&csv, "%s,%d,static α,static,%s,%.2f,%s\n",
                              sim::RegimeName(Regimes()[r]), o.seeds[k], kBaselineRouter, grid[g],
                              rows[next]);
        ++next;
      }
      const size_t best = BestByReward(sweep);
      mean[r][0].Add(sweep[best], grid[best], w);
      for (size_t n = 1; n < N; ++n) {
        ASSIGN_OR_RETURN(const Figures f, Figures::Parse(rows[next]));
        absl::StrAppendFormat(&csv, "%s,%d,%s,%s,%s,,%s\n", sim::RegimeName(Regimes()[r]),
                              o.seeds[k], Rungs()[n].label, Rungs()[n].controller,
                              Rungs()[n].router, rows[next]);
        mean[r][n].Add(f, 0, w);
        ++next;
      }
    }
  }

  std::string md = absl::StrCat(
      "# Ablations (experiment 5)\n\n", stamp.Markdown(),
      absl::StrFormat(
          "\nP99 (ms) and SLO satisfaction, mean over %d seed(s)%s; each rung's change in P99 "
          "against the rung above it. *KV-EMB-Opt*: the oracle static α (the best of the grid "
          "%s by the reward of ARCHITECTURE §3 on the test trace itself) with refill and "
          "popularity prefetch, behind KV-affinity routing (`%s`: a user goes where its K/V "
          "is). The controllers start at α 0.5 and decide every window on each node; the "
          "PPO-based ones run `%s`.\n",
          S, S > 1 ? " (P99 range over seeds in brackets)" : "",
          o.quick ? "{0, 0.5, 0.8}" : "0, 0.1, …, 1", kBaselineRouter, p.policy));
  std::string dat = "regime";
  for (const Rung& rung : Rungs()) {
    if (rung.label != "PPO+adapter+recovery (HLEM)") absl::StrAppend(&dat, " \"", rung.label, "\"");
  }
  absl::StrAppend(&dat, "\n");
  auto ladder = [&](const char* title, size_t from, size_t to) {
    absl::StrAppendFormat(&md, "\n## %s\n\n| rung | router |", title);
    for (size_t r = 0; r < R; ++r) absl::StrAppend(&md, " ", sim::RegimeName(Regimes()[r]), " |");
    absl::StrAppend(&md, "\n|---|---|");
    for (size_t r = 0; r < R; ++r) absl::StrAppend(&md, "---|");
    absl::StrAppend(&md, "\n");
    for (size_t n = from; n < to; ++n) {
      absl::StrAppendFormat(&md, "| %s | `%s` |", Rungs()[n].label, Rungs()[n].router);
      for (size_t r = 0; r < R; ++r) {
        const Mean& m = mean[r][n];
        absl::StrAppendFormat(&md, " %s%.2f", n == 0 ? absl::StrFormat("α %.2f: ", m.alpha) : "",
                              m.p99);
        if (S > 1) absl::StrAppendFormat(&md, " (%.2f–%.2f)", m.p99_lo, m.p99_hi);
        absl::StrAppendFormat(&md, " / %.2f %%", 100 * m.slo);
        if (n > from && mean[r][n - 1].p99 > 0) {
          absl::StrAppendFormat(&md, ", %+.1f %%",
                                100 * (m.p99 - mean[r][n - 1].p99) / mean[r][n - 1].p99);
        }
        absl::StrAppend(&md, " |");
      }
      absl::StrAppend(&md, "\n");
    }
  };
  ladder("System: KV-EMB-Opt → +SmartAllocator → +router", 0, kSystemRungs);
  ladder("Controller: PPO-only → +adapter → +recovery (PPO+recovery last, against the full one)",
         kSystemRungs, N);
  for (size_t r = 0; r < R; ++r) {
    absl::StrAppend(&dat, sim::RegimeName(Regimes()[r]));
    for (size_t n = 0; n < N; ++n) {
      if (Rungs()[n].label != "PPO+adapter+recovery (HLEM)") {
        absl::StrAppendFormat(&dat, " %.4f", mean[r][n].p99);
      }
    }
    absl::StrAppend(&dat, "\n");
  }
  absl::StrAppend(&md,
                  "\nCells: P99 ms / SLO satisfaction, change against the rung above. Files: "
                  "`ablations.csv` (every run, the static grid included), `ablations.png`.\n");
  return WriteBarChartResults(
      o, "ablations", csv, md, dat, N - 1,
      absl::StrFormat("P99 by ablation — %s profile (%s)", p.name, stamp.commit), "P99 (ms)");
}

}  // namespace hlem::eval
