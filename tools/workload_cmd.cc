// `hlem workload`: synthetic GR workloads (sim/workload). generate writes a trace from a config
// (deploy/local/workload.yaml, or the defaults) with optional overrides; stats measures a trace
// (rate, hot-user ratio per window, top-K residency coverage, item popularity exponent); show
// prints its first requests.

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "sim/workload/stats.h"
#include "sim/workload/trace.h"
#include "sim/workload/workload.h"
#include "tools/commands.h"

namespace hlem::tools {
namespace {

struct GenerateArgs {
  std::string config, out, regime, duration, phase_duration, warmup;
  uint64_t seed = 0;
  double rate = 0;
  bool seed_set = false;
  bool explicit_events = false;
};

int WorkloadFail(absl::string_view what, const absl::Status& st) {
  return tools::Fail("workload", what, st);
}

int Generate(const GenerateArgs& a) {
  std::string yaml;
  if (!a.config.empty()) {
    std::ifstream in(a.config);
    if (!in)
      return WorkloadFail("--config", absl::NotFoundError(absl::StrCat("cannot read ", a.config)));
    std::stringstream ss;
    ss << in.rdbuf();
    yaml = ss.str();
  }
  absl::StatusOr<sim::WorkloadConfig> config = sim::ParseWorkloadConfig(yaml);
  if (!config.ok()) return WorkloadFail(a.config.empty() ? "defaults" : a.config, config.status());
  if (a.seed_set) config->seed = a.seed;
  if (a.rate > 0) config->rate = a.rate;
  if (!a.regime.empty() || !a.duration.empty()) {
    // One phase of the given regime (or the first phase's) and duration.
    sim::Phase phase = config->phases.front();
    if (!a.regime.empty()) {
      phase.regime = a.regime == "trend"   ? sim::Regime::kTrend
                     : a.regime == "burst" ? sim::Regime::kBurst
                                           : sim::Regime::kSteady;
    }
    if (!a.duration.empty() && !absl::ParseDuration(a.duration, &phase.duration)) {
      return WorkloadFail("--duration", absl::InvalidArgumentError(absl::StrCat(
                                            "'", a.duration, "' is not a duration (5m, 90s)")));
    }
    config->phases = {phase};
  }
  if (!a.phase_duration.empty()) {
    absl::Duration d;
    if (!absl::ParseDuration(a.phase_duration, &d) || d <= absl::ZeroDuration()) {
      return WorkloadFail("--phase-duration",
                          absl::InvalidArgumentError(absl::StrCat(
                              "'", a.phase_duration, "' is not a positive duration (5m, 90s)")));
    }
    for (sim::Phase& p : config->phases) p.duration = d;
  }
  if (!a.warmup.empty()) {
    absl::Duration d;
    if (!absl::ParseDuration(a.warmup, &d) || d < absl::ZeroDuration()) {
      return WorkloadFail("--warmup", absl::InvalidArgumentError(absl::StrCat(
                                          "'", a.warmup, "' is not a duration (40s, 1m, 0s)")));
    }
    config->phases.front().duration += d;
  }
  auto generator = sim::WorkloadGenerator::Create(*config);
  if (!generator.ok()) return WorkloadFail("config", generator.status());
  const absl::Time start = absl::Now();
  absl::StatusOr<uint64_t> n = sim::WriteTrace(**generator, a.out, !a.explicit_events);
  if (!n.ok()) return WorkloadFail(a.out, n.status());
  std::printf(
      "wrote %s: %llu requests over %.0f s (seed %llu) in %.1f s\n", a.out.c_str(),
      static_cast<unsigned long long>(*n), static_cast<double>((*generator)->duration_ns()) / 1e9,
      static_cast<unsigned long long>(config->seed), absl::ToDoubleSeconds(absl::Now() - start));
  return 0;
}

int Stats(const std::string& path, bool per_window) {
  auto reader = sim::TraceReader::Open(path);
  if (!reader.ok()) return WorkloadFail(path, reader.status());
  absl::StatusOr<sim::WorkloadConfig> config =
      sim::ParseWorkloadConfig((*reader)->header().config_yaml);
  if (!config.ok()) return WorkloadFail(absl::StrCat(path, ": header config"), config.status());
  sim::TraceAnalyzer analyzer(sim::StatsOptionsFor(*config), config->features.size());
  sim::TraceRequest r;
  while (true) {
    absl::StatusOr<bool> more = (*reader)->Next(&r);
    if (!more.ok()) return WorkloadFail(path, more.status());
    if (!*more) break;
    analyzer.Add(r);
  }
  const sim::TraceStats st = analyzer.Finish();
  std::printf("%s: seed %llu, %zu features\n", path.c_str(),
              static_cast<unsigned long long>(config->seed), config->features.size());
  std::printf(
      "requests %llu over %.1f s (%.2f/s); users %llu; events %llu (mean history %.1f); "
      "candidates %llu\n",
      static_cast<unsigned long long>(st.requests), st.duration_s, st.rate,
      static_cast<unsigned long long>(st.users), static_cast<unsigned long long>(st.events),
      st.mean_history_events, static_cast<unsigned long long>(st.candidates));
  std::printf(
      "top-20 residency shard coverage of a user's lookups: mean %.3f, p10 %.3f (%llu "
      "users with >= 100 events)\n",
      st.coverage_mean, st.coverage_p10, static_cast<unsigned long long>(st.coverage_users));
  std::printf("item popularity: Zipf exponent %.3f (configured %.3f)\n", st.item_zipf,
              config->item_zipf);
  uint64_t req = 0, hot = 0;
  for (size_t w = config->hot_windows; w < st.windows.size(); ++w) {
    req += st.windows[w].requests;
    hot += st.windows[w].hot;
  }
  if (req == 0) {
    std::printf("hot-user ratio: n/a (the trace is not longer than the first %u windows)\n",
                config->hot_windows);
  } else {
    std::printf("hot-user ratio after the first %u windows: %.3f\n", config->hot_windows,
                static_cast<double>(hot) / static_cast<double>(req));
  }
  if (per_window) {
    std::printf("%8s %9s %9s\n", "window", "requests", "hot");
    for (size_t w = 0; w < st.windows.size(); ++w) {
      std::printf("%8zu %9llu %9.3f\n", w, static_cast<unsigned long long>(st.windows[w].requests),
                  st.windows[w].hot_ratio());
    }
  }
  return 0;
}

int Show(const std::string& path, uint64_t count) {
  auto reader = sim::TraceReader::Open(path);
  if (!reader.ok()) return WorkloadFail(path, reader.status());
  const size_t F = (*reader)->header().features.size();
  sim::TraceRequest r;
  for (uint64_t i = 0; i < count; ++i) {
    absl::StatusOr<bool> more = (*reader)->Next(&r);
    if (!more.ok()) return WorkloadFail(path, more.status());
    if (!*more) break;
    std::printf("t=%.6fs user=%llu prior_events=%llu new_events=%zu candidates=%zu first_event=[",
                static_cast<double>(r.t_ns) / 1e9, static_cast<unsigned long long>(r.user),
                static_cast<unsigned long long>(r.prior_events), r.new_events.size() / F,
                r.candidates.size() / F);
    for (size_t f = 0; f < F && f < r.new_events.size(); ++f) {
      std::printf("%s%llu", f == 0 ? "" : " ", static_cast<unsigned long long>(r.new_events[f]));
    }
    std::printf("]\n");
  }
  return 0;
}

}  // namespace

void RegisterWorkloadCommands(CLI::App& app, Run* run) {
  CLI::App* workload = app.add_subcommand("workload", "generate and inspect workload traces");
  workload->require_subcommand(1);

  auto g = std::make_shared<GenerateArgs>();
  auto* generate = workload->add_subcommand("generate", "write a trace");
  generate->add_option("--config", g->config, "workload YAML (default: the built-in defaults)");
  generate->add_option("--out", g->out, "trace file to write")->required();
  generate->add_option("--seed", g->seed, "override the config's seed");
  generate->add_option("--rate", g->rate, "override the arrival rate (requests/s)")
      ->check(CLI::PositiveNumber);
  generate->add_option("--regime", g->regime, "one phase of this regime instead of the config's")
      ->check(CLI::IsMember({"steady", "trend", "burst"}));
  CLI::Option* duration = generate->add_option("--duration", g->duration,
                                               "with --regime: the phase's length (e.g. 5m)");
  generate
      ->add_option("--phase-duration", g->phase_duration,
                   "every phase of the config lasts this long (e.g. 45s), in the config's order")
      ->excludes("--regime")
      ->excludes(duration);
  generate->add_option("--warmup", g->warmup,
                       "the first phase lasts this much longer (e.g. 40s): a warm-up for caches "
                       "and controllers that the measurement leaves out (loadgen --warmup-s)");
  generate->add_flag("--explicit-events", g->explicit_events,
                     "write every event's feature ids (default: only their count; readers "
                     "regenerate them from the header's generator config)");
  generate->callback([=] {
    g->seed_set = generate->count("--seed") > 0;
    *run = [=] { return Generate(*g); };
  });

  auto path = std::make_shared<std::string>();
  auto per_window = std::make_shared<bool>(false);
  auto* stats = workload->add_subcommand("stats", "measure a trace");
  stats->add_option("trace", *path, "trace file")->required();
  stats->add_flag("--windows", *per_window, "also print every window's hot-user ratio");
  stats->callback([=] { *run = [=] { return Stats(*path, *per_window); }; });

  auto show_path = std::make_shared<std::string>();
  auto count = std::make_shared<uint64_t>(5);
  auto* show = workload->add_subcommand("show", "print a trace's first requests");
  show->add_option("trace", *show_path, "trace file")->required();
  show->add_option("-n", *count, "requests");
  show->callback([=] { *run = [=] { return Show(*show_path, *count); }; });
}

}  // namespace hlem::tools
