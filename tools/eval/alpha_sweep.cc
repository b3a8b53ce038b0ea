// Experiment 2 of issue 8, the α sweep: P99 against a static α for each regime and for long and
// short histories — is there an interior optimum, and how far does it move?

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "tools/eval/eval.h"
#include "tools/eval/experiments.h"
#include "tools/sim_runner.h"

namespace hlem::eval {
namespace {

namespace fs = std::filesystem;

struct Series {
  sim::Regime regime;
  std::string history;  // "long", "short"
  double history_scale;
  std::string Name() const { return absl::StrCat(sim::RegimeName(regime), " ", history); }
};

// Mean over seeds of each α's figures, per series.
struct Curve {
  Series series;
  std::vector<Figures> mean;  // by α
  std::vector<double> p99_min, p99_max;
  std::vector<int> answered;  // seeds with OK answers, by α
};

}  // namespace

const char* InteriorOptimum(size_t best, size_t first_served, size_t last_served, size_t grid) {
  if (best == 0 || best + 1 == grid) return "no (a grid end)";
  if (best <= first_served || best >= last_served) return "no (the end of the αs that serve)";
  return "yes";
}

absl::Status AlphaSweep(const EvalOptions& o, const Profile& p, Stamp& stamp) {
  std::vector<double> alphas;
  if (o.quick) {
    alphas = {0.2, 0.5, 0.8};
  } else {
    for (int i = 0; i <= 10; ++i) alphas.push_back(i * 0.1);
  }
  ASSIGN_OR_RETURN(const sim::WorkloadConfig workload, LoadWorkload(o, p));
  const double long_scale = workload.history_scale;
  std::vector<Series> series;
  for (sim::Regime regime : {sim::Regime::kSteady, sim::Regime::kTrend, sim::Regime::kBurst}) {
    series.push_back({regime, "long", long_scale});
    series.push_back({regime, "short", long_scale * 0.2});
  }

  // The traces (one per series and seed), then a run per trace and α.
  std::vector<Task> trace_tasks;
  for (const Series& s : series) {
    for (uint64_t seed : o.seeds) {
      trace_tasks.push_back([&o, &p, s, seed]() {
        return MakeTrace(o, p,
                         {.regime = s.regime, .seed = seed, .history_scale = s.history_scale});
      });
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> traces,
                   RunParallel(trace_tasks, o.jobs, o.work_dir));
  {
    ASSIGN_OR_RETURN(const tools::SimSetup setup,
                     tools::PrepareSim(SimOptions(o, p, traces.front(), 0)));
    stamp.device = setup.twin.costs.device;
  }
  std::vector<Task> runs;
  for (const std::string& trace : traces) {
    for (double alpha : alphas) {
      runs.push_back(FiguresTask(o, stamp, SimOptions(o, p, trace, alpha), alpha));
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> rows,
                   RunExperimentRuns(o, traces.size(), runs, stamp));

  // rows[(series · seeds + seed) · alphas + a]
  std::string csv =
      absl::StrCat(stamp.CsvComment(), "regime,history,seed,alpha,", Figures::kCsvColumns, "\n");
  std::vector<Curve> curves;
  const size_t S = o.seeds.size(), A = alphas.size();
  for (size_t si = 0; si < series.size(); ++si) {
    Curve c{.series = series[si]};
    c.mean.resize(A);
    c.p99_min.assign(A, 1e300);
    c.p99_max.assign(A, 0);
    c.answered.assign(A, 0);
    for (size_t k = 0; k < S; ++k) {
      for (size_t a = 0; a < A; ++a) {
        const std::string& row = rows[(si * S + k) * A + a];
        ASSIGN_OR_RETURN(const Figures pt, Figures::Parse(row));
        absl::StrAppendFormat(&csv, "%s,%s,%d,%.2f,%s\n", sim::RegimeName(series[si].regime),
                              series[si].history, o.seeds[k], alphas[a], row);
        Figures& m = c.mean[a];
        const double w = 1.0 / static_cast<double>(S);
        m.slo += w * pt.slo;
        m.reward += w * pt.reward;
        m.requests += pt.requests;
        m.ok += pt.ok;
        if (pt.ok > 0) {  // latencies of seeds with OK answers (α 1 leaves no room for K/V)
          c.answered[a] += 1;
          m.p50_ms += pt.p50_ms;
          m.p99_ms += pt.p99_ms;
          c.p99_min[a] = std::min(c.p99_min[a], pt.p99_ms);
          c.p99_max[a] = std::max(c.p99_max[a], pt.p99_ms);
        }
      }
    }
    for (size_t a = 0; a < A; ++a) {
      if (c.answered[a] > 0) {
        c.mean[a].p50_ms /= c.answered[a];
        c.mean[a].p99_ms /= c.answered[a];
      }
    }
    curves.push_back(std::move(c));
  }

  // The Markdown page: P99 by α and series, then each series' optimum.
  std::string md = absl::StrCat(
      "# α sweep (experiment 2)\n\n", stamp.Markdown(),
      "\nP99 (ms) of OK answers at each static α (share of the HBM pool for embeddings), mean over "
      "the seeds; **bold**: the column's best α by the reward of ARCHITECTURE §3 (SLO fraction − "
      "max(0, P99 − SLO) ÷ SLO), ties by P99 — with every SLO met the reward is the SLO fraction "
      "and "
      "differences of a few requests decide, so the lowest P99 is listed beside it. *long*: the "
      "profile's histories; *short*: ×0.2. At α 1 there is no KV pool: every request fails "
      "(RESOURCE_EXHAUSTED).\n\n| α |");
  for (const Curve& c : curves) absl::StrAppend(&md, " ", c.series.Name(), " |");
  absl::StrAppend(&md, "\n|---|");
  for (size_t i = 0; i < curves.size(); ++i) absl::StrAppend(&md, "---|");
  absl::StrAppend(&md, "\n");
  std::vector<size_t> best;
  for (const Curve& c : curves) best.push_back(BestByReward(c.mean));
  for (size_t a = 0; a < A; ++a) {
    absl::StrAppendFormat(&md, "| %.2f |", alphas[a]);
    for (size_t i = 0; i < curves.size(); ++i) {
      const Figures& pt = curves[i].mean[a];
      if (curves[i].answered[a] == 0) {
        absl::StrAppend(&md, " every request failed |");
      } else if (S > 1) {
        absl::StrAppendFormat(&md, best[i] == a ? " **%.2f** (%.2f–%.2f) |" : " %.2f (%.2f–%.2f) |",
                              pt.p99_ms, curves[i].p99_min[a], curves[i].p99_max[a]);
      } else {
        absl::StrAppendFormat(&md, best[i] == a ? " **%.2f** |" : " %.2f |", pt.p99_ms);
      }
    }
    absl::StrAppend(&md, "\n");
  }
  absl::StrAppend(&md,
                  "\n| series | best α | P99 there (ms) | SLO there | lowest P99 (α) | P99 at "
                  "α ",
                  alphas.front(),
                  " | worst P99 ÷ best | interior optimum |\n|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < curves.size(); ++i) {
    const Curve& c = curves[i];
    const Figures& b = c.mean[best[i]];
    double worst = 0;
    size_t lowest = best[i], first_served = A, last_served = 0;
    for (size_t a = 0; a < A; ++a) {
      if (c.answered[a] == 0) continue;
      first_served = std::min(first_served, a);
      last_served = a;
      worst = std::max(worst, c.mean[a].p99_ms);
      if (c.mean[a].p99_ms < c.mean[lowest].p99_ms) lowest = a;
    }
    // α 1, without a KV pool, serves nothing: an optimum at 0.9 is not interior.
    const char* interior = InteriorOptimum(best[i], first_served, last_served, A);
    absl::StrAppendFormat(&md, "| %s | %.2f | %.2f | %.2f %% | %.2f (%.2f) | %.2f | %.2f | %s |\n",
                          c.series.Name(), alphas[best[i]], b.p99_ms, 100 * b.slo,
                          c.mean[lowest].p99_ms, alphas[lowest], c.mean.front().p99_ms,
                          b.p99_ms > 0 ? worst / b.p99_ms : 0, interior);
  }
  absl::StrAppend(&md, "\nFiles: `alpha-sweep.csv` (every run, each seed), `alpha-sweep.png`.\n");

  // The plot: P99 against α, a line per series.
  const fs::path data = fs::path(o.work_dir) / "plots" / "alpha-sweep.dat";
  std::string dat;
  for (const Curve& c : curves) {
    absl::StrAppend(&dat, "# ", c.series.Name(), "\n");
    for (size_t a = 0; a < A; ++a) {
      if (c.answered[a] > 0)
        absl::StrAppendFormat(&dat, "%.2f %.4f\n", alphas[a], c.mean[a].p99_ms);
    }
    absl::StrAppend(&dat, "\n\n");
  }
  std::string script = absl::StrFormat(
      "set title 'P99 against a static α — %s profile (%s)'\nset xlabel 'α (EMB share of the "
      "HBM pool)'\nset ylabel 'P99 (ms)'\nset grid\nset key outside right\nplot ",
      p.name, stamp.commit);
  for (size_t i = 0; i < curves.size(); ++i) {
    absl::StrAppendFormat(&script, "%s'%s' index %d using 1:2 with linespoints title '%s'",
                          i == 0 ? "" : ", ", data.string(), i, curves[i].series.Name());
  }
  absl::StrAppend(&script, "\n");
  {
    std::error_code ec;
    fs::create_directories(data.parent_path(), ec);
    std::ofstream(data) << dat;
  }
  RETURN_IF_ERROR(WriteOutput(o, "alpha-sweep.csv", csv));
  RETURN_IF_ERROR(WriteOutput(o, "alpha-sweep.md", md));
  return Plot(script, (fs::path(o.out_dir) / "alpha-sweep.png").string(), o.work_dir);
}

}  // namespace hlem::eval
