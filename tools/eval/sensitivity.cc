// The cost-model sensitivity of issue 8: the headline comparison — HLEM against the oracle static
// α, per regime — re-run with each cost coefficient of the profile at ×0.5 and ×2, one at a time
// (the cost file's coefficients and the node config's link bandwidth). A win that does not
// survive a change is listed as such.

#include <algorithm>
#include <filesystem>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "sim/twin/cost_model.h"
#include "tools/eval/eval.h"
#include "tools/eval/experiments.h"
#include "tools/sim_runner.h"

namespace hlem::eval {
namespace {

namespace fs = std::filesystem;

// A coefficient and how to scale it: in the cost model, or (link) in the node config.
struct Coefficient {
  std::string name;
  std::function<void(sim::CostModel&, double)> scale;  // null: the node config's link
};

const std::vector<Coefficient>& Coefficients() {
  auto duration = [](absl::Duration sim::CostModel::*field) {
    return [field](sim::CostModel& c, double f) { c.*field = c.*field * f; };
  };
  static const std::vector<Coefficient>* all = new std::vector<Coefficient>{
      {"flops_per_second", [](sim::CostModel& c, double f) { c.flops_per_second *= f; }},
      {"step_overhead", duration(&sim::CostModel::step_overhead)},
      {"request_overhead", duration(&sim::CostModel::request_overhead)},
      {"lookup_per_row", duration(&sim::CostModel::lookup_per_row)},
      {"fetch_overhead", duration(&sim::CostModel::fetch_overhead)},
      {"fetch_per_row", duration(&sim::CostModel::fetch_per_row)},
      {"router_overhead", duration(&sim::CostModel::router_overhead)},
      {"link_bytes_per_second", nullptr},
  };
  return *all;
}

// One cost model: the profile's, or one coefficient scaled.
struct Variant {
  std::string label;  // "as in the profile", "fetch_per_row ×0.5"
  std::string costs, node_config;
};

// The node config with its link's bytes_per_second × factor.
absl::StatusOr<std::string> ScaledLink(const EvalOptions& o, const Profile& p, double factor) {
  return NodeConfigVariant(o, p, absl::StrFormat("link-x%g", factor), [factor](std::string* yaml) {
    const std::regex link(R"((link:\s*\{\s*bytes_per_second:\s*)([0-9.eE+-]+))");
    std::smatch m;
    if (!std::regex_search(*yaml, m, link)) {
      return absl::InvalidArgumentError("no `link: {bytes_per_second: ...}` line");
    }
    yaml->replace(static_cast<size_t>(m.position(2)), static_cast<size_t>(m.length(2)),
                  absl::StrFormat("%.6g", std::stod(m[2].str()) * factor));
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status Sensitivity(const EvalOptions& o, const Profile& p, Stamp& stamp) {
  for (const std::string& name : o.coefficients) {
    if (std::none_of(Coefficients().begin(), Coefficients().end(),
                     [&](const Coefficient& c) { return c.name == name; })) {
      std::string known;
      for (const Coefficient& c : Coefficients()) {
        absl::StrAppend(&known, known.empty() ? "" : ", ", c.name);
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--coefficients: no coefficient '", name, "' (known: ", known, ")"));
    }
  }
  const fs::path repo(o.repo);
  ASSIGN_OR_RETURN(const sim::CostModel base, sim::LoadCostModel((repo / p.costs).string()));
  std::vector<Variant> variants = {
      {"as in the profile", (repo / p.costs).string(), (repo / p.node_config).string()}};
  for (const Coefficient& c : Coefficients()) {
    if (!o.coefficients.empty() &&
        std::find(o.coefficients.begin(), o.coefficients.end(), c.name) == o.coefficients.end()) {
      continue;
    }
    for (double factor : {0.5, 2.0}) {
      Variant v{.label = absl::StrFormat("%s ×%g", c.name, factor),
                .costs = (repo / p.costs).string(),
                .node_config = (repo / p.node_config).string()};
      if (c.scale == nullptr) {
        ASSIGN_OR_RETURN(v.node_config, ScaledLink(o, p, factor));
      } else {
        sim::CostModel scaled = base;
        c.scale(scaled, factor);
        const fs::path path = fs::path(o.work_dir) / "costs" /
                              absl::StrFormat("%s-%s-x%g.yaml", p.name, c.name, factor);
        RETURN_IF_ERROR(WriteFileAtomically(path, sim::CostModelYaml(scaled)));
        v.costs = path.string();
      }
      variants.push_back(std::move(v));
    }
  }
  // A coarser grid than e2e's: 17 cost models × 3 regimes.
  const std::vector<double> grid =
      o.quick ? std::vector<double>{0, 0.5, 0.8} : std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0};
  ASSIGN_OR_RETURN(const std::vector<std::string> traces, RegimeTraces(o, p, stamp));
  const size_t V = variants.size(), R = Regimes().size(), S = o.seeds.size(), G = grid.size();
  std::vector<Task> runs;
  for (const Variant& v : variants) {
    for (const std::string& trace : traces) {
      for (double alpha : grid) {
        tools::SimSetupOptions run = SimOptions(o, p, trace, alpha);
        run.costs = v.costs;
        run.node_config = v.node_config;
        runs.push_back(FiguresTask(o, stamp, run, alpha));
      }
      tools::SimSetupOptions run = SimOptions(o, p, trace, 0.5);
      run.costs = v.costs;
      run.node_config = v.node_config;
      run.controller = {.name = "hlem", .weights = (repo / p.policy).string(), .alpha = 0.5};
      runs.push_back(FiguresTask(o, stamp, run, 0.5));
    }
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> rows,
                   RunExperimentRuns(o, traces.size(), runs, stamp));

  std::string csv = absl::StrCat(stamp.CsvComment(), "costs,regime,seed,system,alpha,",
                                 Figures::kCsvColumns, "\n");
  // change[v][r]: HLEM's P99 against the oracle static α's, mean over seeds
  std::vector<std::vector<double>> change(V, std::vector<double>(R)),
      oracle_alpha = change, oracle_p99 = change, hlem_p99 = change;
  size_t next = 0;
  for (size_t v = 0; v < V; ++v) {
    for (size_t r = 0; r < R; ++r) {
      for (size_t k = 0; k < S; ++k) {
        std::vector<Figures> sweep(G);
        for (size_t g = 0; g < G; ++g) {
          ASSIGN_OR_RETURN(sweep[g], Figures::Parse(rows[next]));
          absl::StrAppendFormat(&csv, "%s,%s,%d,static,%.2f,%s\n", variants[v].label,
                                sim::RegimeName(Regimes()[r]), o.seeds[k], grid[g], rows[next]);
          ++next;
        }
        ASSIGN_OR_RETURN(const Figures hlem, Figures::Parse(rows[next]));
        absl::StrAppendFormat(&csv, "%s,%s,%d,hlem,,%s\n", variants[v].label,
                              sim::RegimeName(Regimes()[r]), o.seeds[k], rows[next]);
        ++next;
        const size_t best = BestByReward(sweep);
        const double w = 1.0 / static_cast<double>(S);
        oracle_alpha[v][r] += w * grid[best];
        oracle_p99[v][r] += w * sweep[best].p99_ms;
        hlem_p99[v][r] += w * hlem.p99_ms;
      }
      change[v][r] =
          oracle_p99[v][r] > 0 ? 100 * (hlem_p99[v][r] - oracle_p99[v][r]) / oracle_p99[v][r] : 0;
    }
  }

  std::string md = absl::StrCat(
      "# Cost sensitivity\n\n", stamp.Markdown(),
      absl::StrFormat(
          "\nThe headline comparison — HLEM (the SmartAllocator with `%s` from α 0.5, the "
          "KV–EMB-aware router) against the oracle static α (the best of {%s} by the reward "
          "of ARCHITECTURE §3 on the test trace itself) — with one cost coefficient at a time "
          "at ×0.5 and ×2 (`%s`; the link: the node config's `memory.link.bytes_per_second`). "
          "Cells: oracle α, its P99 → HLEM's P99 (ms), and the change; negative = HLEM "
          "faster. Mean over %d seed(s).\n\n| costs |",
          p.policy,
          absl::StrJoin(grid, ", ",
                        [](std::string* out, double a) { absl::StrAppendFormat(out, "%.1f", a); }),
          p.costs, S));
  for (sim::Regime regime : Regimes()) absl::StrAppend(&md, " ", sim::RegimeName(regime), " |");
  absl::StrAppend(&md, "\n|---|");
  for (size_t r = 0; r < R; ++r) absl::StrAppend(&md, "---|");
  absl::StrAppend(&md, "\n");
  std::string dat = "costs";
  for (sim::Regime regime : Regimes()) absl::StrAppend(&dat, " ", sim::RegimeName(regime));
  absl::StrAppend(&dat, "\n");
  for (size_t v = 0; v < V; ++v) {
    absl::StrAppendFormat(&md, "| %s |", variants[v].label);
    absl::StrAppendFormat(&dat, "\"%s\"", variants[v].label);
    for (size_t r = 0; r < R; ++r) {
      absl::StrAppendFormat(&md, " α %.1f: %.2f → %.2f (%+.1f %%) |", oracle_alpha[v][r],
                            oracle_p99[v][r], hlem_p99[v][r], change[v][r]);
      absl::StrAppendFormat(&dat, " %.3f", change[v][r]);
    }
    absl::StrAppend(&md, "\n");
    absl::StrAppend(&dat, "\n");
  }
  // Which of the profile's wins (HLEM faster) survive every change.
  absl::StrAppend(&md, "\n");
  for (size_t r = 0; r < R; ++r) {
    const char* regime = sim::RegimeName(Regimes()[r]);
    if (change[0][r] >= 0) {
      absl::StrAppendFormat(&md, "- %s: no win to keep (HLEM %+.1f %% at the profile's costs).\n",
                            regime, change[0][r]);
      continue;
    }
    std::string lost;
    for (size_t v = 1; v < V; ++v) {
      if (change[v][r] >= 0) absl::StrAppend(&lost, lost.empty() ? "" : ", ", variants[v].label);
    }
    absl::StrAppendFormat(&md, "- %s: HLEM %+.1f %% at the profile's costs; %s\n", regime,
                          change[0][r],
                          lost.empty() ? "the win survives every change."
                                       : absl::StrCat("the win does **not** survive ", lost, "."));
  }
  absl::StrAppend(&md,
                  "\nFiles: `sensitivity.csv` (every run), `sensitivity.png` (the change per "
                  "cost model and regime).\n");
  return WriteBarChartResults(
      o, "sensitivity", csv, md, dat, R,
      absl::StrFormat("HLEM P99 vs the oracle static α, by cost model — %s profile (%s)", p.name,
                      stamp.commit),
      "P99 change (%)", /*from_zero=*/false);
}

}  // namespace hlem::eval
