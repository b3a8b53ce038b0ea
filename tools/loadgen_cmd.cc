// `hlem loadgen`: replays a trace against the router, open loop (tools/loadgen/replayer.h), with a
// progress bar; prints the summary per decision window and overall, and writes per-request and
// per-window CSV. Exit 0 when every request got its one outcome (1 with --fail-on-error and any
// request not OK), 2 for bad usage or a damaged trace.

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_flags.h"
#include "common/metrics.h"
#include "common/process.h"
#include "sim/workload/trace.h"
#include "sim/workload/workload.h"
#include "tools/commands.h"
#include "tools/loadgen/loadgen_metrics.h"
#include "tools/loadgen/replayer.h"
#include "tools/loadgen/summary.h"

namespace hlem::tools {
namespace {

struct LoadgenFlags {
  std::string trace, router, mode = "full", csv, windows_csv, phases_csv, metrics_listen,
                             ports_file;
  double speed = 1, deadline_ms = 1000, slo_ms = 50, window_s = 0, warmup_s = 0, metrics_hold_s = 0;
  uint64_t limit = 0;
  uint32_t max_in_flight = 4096;
  bool fail_on_error = false, quiet = false;
  ClientSecurityFlags security;
};

int Loadgen(const LoadgenFlags& f) {
  auto trace = sim::TraceReader::Open(f.trace);
  if (!trace.ok()) {
    std::fprintf(stderr, "hlem loadgen: --trace: %s\n",
                 std::string(trace.status().message()).c_str());
    return 2;
  }
  uint64_t window_ns = static_cast<uint64_t>(f.window_s * 1e9);
  const absl::StatusOr<sim::WorkloadConfig> config =
      sim::ParseWorkloadConfig((*trace)->header().config_yaml);
  if (window_ns == 0) {
    window_ns = config.ok() ? static_cast<uint64_t>(absl::ToInt64Nanoseconds(config->window))
                            : 5'000'000'000;
  }
  // Windows and phases on the replay's clock: the trace's shrink with the speed.
  window_ns = static_cast<uint64_t>(static_cast<double>(window_ns) / f.speed);
  const std::vector<loadgen::PhaseSpan> phases = config.ok()
                                                     ? loadgen::PhaseSpans(config->phases, f.speed)
                                                     : std::vector<loadgen::PhaseSpan>{};
  // Per-regime metrics of what the client sees, for Prometheus (tools/loadgen/loadgen_metrics.h).
  MetricsRegistry registry;
  std::unique_ptr<MetricsExposer> exposer;
  std::unique_ptr<loadgen::LoadgenMetrics> metrics;
  if (!f.metrics_listen.empty()) {
    auto created = MetricsExposer::Create(f.metrics_listen, registry);
    if (!created.ok()) {
      std::fprintf(stderr, "hlem loadgen: --metrics-listen: %s\n",
                   std::string(created.status().message()).c_str());
      return 2;
    }
    exposer = std::move(*created);
    metrics = std::make_unique<loadgen::LoadgenMetrics>(registry, phases, f.slo_ms);
    WritePortsFile(f.ports_file, {{"metrics", exposer->port()}});
  }
  const absl::StatusOr<ChannelOptions> channel = ResolveChannelOptions(f.security, "--token-file");
  if (!channel.ok()) return Fail("loadgen", "security", channel.status());
  const double total = f.limit > 0 ? static_cast<double>(f.limit) : 0;
  loadgen::ReplayOptions options{.router = f.router,
                                 .channel = *channel,
                                 .speed = f.speed,
                                 .limit = f.limit,
                                 .deadline = absl::Microseconds(f.deadline_ms * 1e3),
                                 .max_in_flight = f.max_in_flight,
                                 .delta = f.mode == "delta"};
  if (metrics) options.on_outcome = [&metrics](const loadgen::Outcome& o) { metrics->Observe(o); };
  const double duration_s = static_cast<double>((*trace)->header().duration_ns) / 1e9 / f.speed;
  const absl::Time start = absl::Now();
  // A redrawn bar on a terminal; a line every 10 s into a log.
  const bool tty = isatty(STDERR_FILENO) != 0;
  absl::Time last_line = start;
  if (!f.quiet) {
    options.progress = [&](uint64_t read, uint64_t recorded, uint64_t in_flight) {
      if (!tty && absl::Now() - last_line < absl::Seconds(10)) return;
      last_line = absl::Now();
      const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
      const double frac = total > 0 ? static_cast<double>(read) / total
                                    : std::min(1.0, elapsed / std::max(duration_s, 1e-9));
      const int bars = static_cast<int>(frac * 30);
      std::fprintf(stderr, "%s[%s%s] %5.1f %% %llu sent, %llu answered, %llu in flight   %s",
                   tty ? "\r" : "", std::string(static_cast<size_t>(bars), '=').c_str(),
                   std::string(static_cast<size_t>(30 - bars), ' ').c_str(), 100 * frac,
                   static_cast<unsigned long long>(read), static_cast<unsigned long long>(recorded),
                   static_cast<unsigned long long>(in_flight), tty ? "" : "\n");
    };
  }
  std::vector<loadgen::Outcome> outcomes;
  const absl::Status st = loadgen::Replay(**trace, options, &outcomes);
  if (!f.quiet && tty) std::fprintf(stderr, "\n");
  if (st.code() == absl::StatusCode::kInvalidArgument && outcomes.empty()) {
    std::fprintf(stderr, "hlem loadgen: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (absl::Status check = loadgen::Check(outcomes); !check.ok()) {
    std::fprintf(stderr, "hlem loadgen: %s\n", std::string(check.message()).c_str());
    return 1;
  }
  const loadgen::Report report = loadgen::Summarize(
      outcomes, window_ns, f.slo_ms, static_cast<uint64_t>(f.warmup_s / f.speed * 1e9), phases);
  std::printf("loadgen: %s -> %s, %s mode, speed %.2f\n%s", f.trace.c_str(), f.router.c_str(),
              f.mode.c_str(), f.speed, loadgen::FormatReport(report, f.slo_ms).c_str());
  std::printf("every request recorded once: %zu sent or refused, %zu outcomes\n", outcomes.size(),
              outcomes.size());
  for (const auto& [path, body] : {std::pair{f.csv, loadgen::OutcomesCsv(outcomes)},
                                   std::pair{f.windows_csv, loadgen::WindowsCsv(report)},
                                   std::pair{f.phases_csv, loadgen::PhasesCsv(report)}}) {
    if (path.empty()) continue;
    std::ofstream out(path);
    out << body;
    if (!out) {
      std::fprintf(stderr, "hlem loadgen: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  if (exposer && f.metrics_hold_s > 0) {  // a last scrape of the final counts
    std::fflush(stdout);
    absl::SleepFor(absl::Seconds(f.metrics_hold_s));
  }
  if (!st.ok()) {
    std::fprintf(stderr, "hlem loadgen: trace stopped early: %s\n",
                 std::string(st.message()).c_str());
    return 2;
  }
  return f.fail_on_error && report.overall.ok != report.overall.requests ? 1 : 0;
}

}  // namespace

void RegisterLoadgenCommands(CLI::App& app, Run* run) {
  auto f = std::make_shared<LoadgenFlags>();
  CLI::App* cmd = app.add_subcommand("loadgen", "replay a trace against the router (open loop)");
  cmd->add_option("--trace", f->trace, "trace file (hlem workload generate)")->required();
  cmd->add_option("--router", f->router, "router gRPC address host:port")->required();
  cmd->add_option("--speed", f->speed, "time scale: 2 replays twice as fast")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--limit", f->limit, "replay only the first N requests");
  cmd->add_option("--deadline-ms", f->deadline_ms, "per-request deadline")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--slo-ms", f->slo_ms, "latency SLO for the satisfaction figures")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--warmup-s", f->warmup_s,
                  "leave requests of the trace's first N seconds out of the overall summary "
                  "(they are sent and recorded; the caches fill meanwhile)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--window-s", f->window_s, "summary window (default: the trace's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--mode", f->mode, "full: whole histories; delta: new events + prefix")
      ->check(CLI::IsMember({"full", "delta"}));
  cmd->add_option("--max-in-flight", f->max_in_flight,
                  "calls out at once; beyond it a request is recorded RESOURCE_EXHAUSTED unsent")
      ->check(CLI::Range(1u, 1000000u));
  cmd->add_option("--csv", f->csv, "write one row per request here");
  cmd->add_option("--windows-csv", f->windows_csv, "write one row per window here");
  cmd->add_option("--phases-csv", f->phases_csv,
                  "write one row per phase of the trace (steady, trend, burst) here");
  cmd->add_option("--metrics-listen", f->metrics_listen,
                  "serve Prometheus /metrics here: outcomes, latency and SLO attainment by regime "
                  "(port 0 = any free port; '' = off)");
  cmd->add_option("--metrics-hold-s", f->metrics_hold_s,
                  "keep /metrics up this long after the replay, for a last scrape")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--ports-file", f->ports_file, "write 'metrics=<port>' here once serving");
  cmd->add_flag("--fail-on-error", f->fail_on_error, "exit 1 when any request was not OK");
  cmd->add_flag("--quiet", f->quiet, "no progress bar");
  AddClientSecurityFlags(*cmd, &f->security, "--token-file",
                         "file holding the router's frontend bearer token");
  cmd->callback([=] { *run = [=] { return Loadgen(*f); }; });
}

}  // namespace hlem::tools
