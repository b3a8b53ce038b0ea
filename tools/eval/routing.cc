// Experiment 6 of issue 8, routing: KV-only vs EMB-only vs joint routing (HLEM's, with its
// weights calibrated online and with the configured ones of the paper's Algorithm 1), beside
// round-robin and least-loaded, at one static α: P99, SLO, KV reuse, EMB hit rate, stale KV hits
// and the locality given up for load.

#include <chrono>
#include <cstdio>
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

struct Policy {
  std::string label, router;
  bool calibrate;
};

const std::vector<Policy>& Policies() {
  static const std::vector<Policy>* policies = new std::vector<Policy>{
      {"hlem", "hlem", true},
      {"hlem (configured weights)", "hlem", false},
      {"kv_only", "kv_only", true},
      {"emb_only", "emb_only", true},
      {"least_loaded", "least_loaded", true},
      {"round_robin", "round_robin", true},
  };
  return *policies;
}

}  // namespace

absl::Status Routing(const EvalOptions& o, const Profile& p, Stamp& stamp) {
  constexpr double kAlpha = 0.5;
  const std::vector<sim::Regime>& regimes = Regimes();
  ASSIGN_OR_RETURN(const std::vector<std::string> traces, RegimeTraces(o, p, stamp));
  const std::vector<Policy>& policies = Policies();
  std::vector<Task> runs;
  for (const std::string& trace : traces) {
    for (const Policy& policy : policies) {
      tools::SimSetupOptions options = SimOptions(o, p, trace, kAlpha);
      options.router = policy.router;
      options.calibrate_costs = policy.calibrate;
      runs.push_back(FiguresTask(o, stamp, options, kAlpha));
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> rows,
                   RunExperimentRuns(o, traces.size(), runs, stamp));

  // rows[(regime · seeds + seed) · policies + policy]; means over seeds.
  std::string csv =
      absl::StrCat(stamp.CsvComment(), "regime,seed,policy,", Figures::kCsvColumns, "\n");
  const size_t S = o.seeds.size(), P = policies.size();
  std::vector<std::vector<Figures>> mean(regimes.size(), std::vector<Figures>(P));
  for (size_t g = 0; g < regimes.size(); ++g) {
    for (size_t k = 0; k < S; ++k) {
      for (size_t i = 0; i < P; ++i) {
        const std::string& row = rows[(g * S + k) * P + i];
        ASSIGN_OR_RETURN(const Figures f, Figures::Parse(row));
        absl::StrAppend(&csv, sim::RegimeName(regimes[g]), ",", o.seeds[k], ",", policies[i].label,
                        ",", row, "\n");
        Figures& m = mean[g][i];
        const double w = 1.0 / static_cast<double>(S);
        m.p50_ms += w * f.p50_ms;
        m.p99_ms += w * f.p99_ms;
        m.slo += w * f.slo;
        m.kv_reuse += w * f.kv_reuse;
        m.emb_hit += w * f.emb_hit;
        m.stale += w * f.stale;
        m.kv_given_up += w * f.kv_given_up;
        m.emb_given_up += w * f.emb_given_up;
      }
    }
  }

  std::string md = absl::StrCat(
      "# Routing (experiment 6)\n\n", stamp.Markdown(),
      absl::StrFormat(
          "\nEvery node at a static α %.1f; the same traces for every policy; means over the "
          "seeds. *hlem*: the joint score with weights learnt online (router "
          "`--calibrate-costs`, the default); *configured weights*: the paper's Algorithm 1 "
          "with C_kv = C_emb = C_ld. *KV reuse*: cached ÷ history tokens; *stale*: dispatches "
          "the router believed KV-resident that were not; *KV given up*: answers that had a "
          "node with the user's K/V and went elsewhere; *EMB given up*: mean best h_emb − the "
          "chosen node's.\n",
          kAlpha));
  for (size_t g = 0; g < regimes.size(); ++g) {
    absl::StrAppend(&md, "\n## ", sim::RegimeName(regimes[g]),
                    "\n\n| policy | P99 ms | P50 ms | SLO | KV reuse | EMB hits | stale | KV "
                    "given up | EMB given up |\n|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < P; ++i) {
      const Figures& m = mean[g][i];
      absl::StrAppendFormat(&md,
                            "| %s | %.2f | %.2f | %.2f %% | %.1f %% | %.1f %% | %.2f %% | %.1f %% "
                            "| %.3f |\n",
                            policies[i].label, m.p99_ms, m.p50_ms, 100 * m.slo, 100 * m.kv_reuse,
                            100 * m.emb_hit, 100 * m.stale, 100 * m.kv_given_up, m.emb_given_up);
    }
  }
  absl::StrAppend(&md, "\nFiles: `routing.csv` (every run, each seed), `routing.png`.\n");

  // The plot: P99 per policy, a cluster per regime.
  std::string dat = "regime";
  for (const Policy& policy : policies) absl::StrAppend(&dat, " \"", policy.label, "\"");
  absl::StrAppend(&dat, "\n");
  for (size_t g = 0; g < regimes.size(); ++g) {
    absl::StrAppend(&dat, sim::RegimeName(regimes[g]));
    for (size_t i = 0; i < P; ++i) absl::StrAppendFormat(&dat, " %.4f", mean[g][i].p99_ms);
    absl::StrAppend(&dat, "\n");
  }
  return WriteBarChartResults(o, "routing", csv, md, dat, P,
                              absl::StrFormat("P99 by routing policy at α %.1f — %s profile (%s)",
                                              kAlpha, p.name, stamp.commit),
                              "P99 (ms)");
}

}  // namespace hlem::eval
