// router: the frontend-facing entry point. Scores every serving node per request (KV residency,
// EMB locality, load, affinity; ARCHITECTURE §6) and forwards the request to the best one.
// Wiring only: flags, node membership (a static list or a DNS name, health-checked; joins and
// leaves at run time), residency subscriptions, service, signals.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cli.h"
#include "common/clock.h"
#include "common/grpc_flags.h"
#include "common/grpc_health_probe.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/membership.h"
#include "common/metrics.h"
#include "common/periodic.h"
#include "common/process.h"
#include "common/request_limits.h"
#include "grpcpp/client_context.h"
#include "router/core/cluster.h"
#include "router/core/concurrency_limit.h"
#include "router/service/node_links.h"
#include "router/service/router_metrics.h"
#include "router/service/router_service.h"

namespace {

namespace v1 = ::hlem::v1;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "router: %s\n", std::string(status.ToString()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"HLEM router"};
  std::string nodes_flag, listen = "127.0.0.1:0", metrics_listen = "127.0.0.1:0", ports_file,
                          health_listen, log_level = "info", policy = "hlem",
                          all_overloaded = "least_loaded";
  double tau = 0.85, epsilon = 0, c_kv = 1, c_emb = 1, c_load = 1, speculative_ttl_ms = 2000,
         max_report_age_ms = 3000, in_flight_capacity = 64, startup_timeout_s = 60;
  uint64_t seed = 1;
  uint32_t top_k = 20, max_candidates = 512, max_history_events = 1 << 16;
  bool retry = true;
  app.add_option("--nodes", nodes_flag,
                 "the nodes' serving addresses: host:port,host:port,... or dns:///name:port (every "
                 "address the name resolves to, e.g. a Kubernetes headless service)")
      ->required();
  bool calibrate = true;
  double calibration_half_life = 500;
  app.add_option("--calibrate-costs", calibrate,
                 "learn C_kv, C_emb and C_ld online from the nodes' measured compute, fetch and "
                 "queue times (true by default; false: the configured --c-* weights)");
  app.add_option("--calibration-half-life", calibration_half_life,
                 "answers after which an old cost sample counts half")
      ->check(CLI::Range(1.0, 1e9));
  double discovery_interval_s = 2;
  uint32_t unhealthy_to_leave = 3;
  std::string h_emb = "shards";
  app.add_option("--discovery-interval-s", discovery_interval_s,
                 "how often the node list is resolved and health-checked")
      ->check(CLI::Range(0.01, 3600.0));
  app.add_option("--unhealthy-to-leave", unhealthy_to_leave,
                 "failed health checks in a row after which a node leaves")
      ->check(CLI::Range(1u, 1000u));
  app.add_option("--h-emb", h_emb,
                 "h_emb: shards (|Prof ∩ EMBM| / |Prof|, the paper's) or events (weighted by the "
                 "profile's event counts)")
      ->check(CLI::IsMember({"shards", "events"}));
  app.add_option("--listen", listen, "gRPC address (port 0 = any free port)");
  app.add_option("--metrics-listen", metrics_listen, "Prometheus /metrics address ('' = off)");
  app.add_option("--health-listen", health_listen, hlem::kHealthListenHelp);
  app.add_option("--ports-file", ports_file,
                 "write 'grpc=<port>', 'metrics=<port>' and 'health=<port>' here once serving");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_option("--policy", policy,
                 "hlem | round_robin | least_loaded | user_hash | kv_only | emb_only");
  app.add_option("--tau", tau, "load threshold τ")->check(CLI::Range(0.0, 1.0));
  app.add_option("--epsilon", epsilon, "affinity bonus ε for the user's last node (0: none)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--c-kv", c_kv, "KV miss cost C_kv")->check(CLI::NonNegativeNumber);
  app.add_option("--c-emb", c_emb, "EMB miss cost C_emb")->check(CLI::NonNegativeNumber);
  app.add_option("--c-load", c_load, "load cost C_ld")->check(CLI::NonNegativeNumber);
  app.add_option("--all-overloaded", all_overloaded, "least_loaded | shed")
      ->check(CLI::IsMember({"least_loaded", "shed"}));
  app.add_option("--profile-top-k", top_k, "residency shards per user profile (K)")
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--speculative-ttl-ms", speculative_ttl_ms, "speculative KV entries' lifetime")
      ->check(CLI::Range(0.0, 600000.0));
  app.add_option("--max-report-age-ms", max_report_age_ms,
                 "older load reports make a node count as saturated")
      ->check(CLI::Range(1.0, 600000.0));
  app.add_option("--in-flight-capacity", in_flight_capacity,
                 "router requests in flight (beyond the last load report) that fill a node")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-candidates", max_candidates, "candidates per request");
  app.add_option("--max-history-events", max_history_events, "events per request");
  app.add_option("--retry", retry,
                 "retry once on the next-best node when a node is unavailable or refuses at "
                 "admission (not after a late shed)");
  hlem::router::RetryBudgetOptions retry_budget;
  app.add_option("--retry-budget-ratio", retry_budget.ratio,
                 "retries elsewhere per request over the last 10 s (beyond it and the floor, the "
                 "first attempt's error goes back)")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--retry-budget-min-per-s", retry_budget.min_per_second,
                 "retries always allowed at this rate, whatever the traffic")
      ->check(CLI::Range(0.0, 1e6));
  uint32_t max_in_flight = 0;
  app.add_option("--max-in-flight", max_in_flight,
                 "Recommend calls handled at once; beyond, RESOURCE_EXHAUSTED at once (0 = no "
                 "limit)");
  bool adaptive_in_flight = false;
  hlem::router::ConcurrencyLimitOptions limit_options;
  CLI::Option* adaptive_flag = app.add_flag(
      "--adaptive-in-flight", adaptive_in_flight,
      "limit the Recommend calls in flight adaptively: to what keeps their latency within "
      "--adaptive-tolerance × their latency at low concurrency (at most "
      "--adaptive-min-in-flight calls in flight); beyond, RESOURCE_EXHAUSTED at once. "
      "--max-in-flight, when set, caps it (docs/router.md)");
  app.add_option("--adaptive-tolerance", limit_options.tolerance,
                 "latency allowed by --adaptive-in-flight, as a multiple of the unloaded latency")
      ->check(CLI::Range(1.0, 1000.0))
      ->needs(adaptive_flag);
  app.add_option("--adaptive-min-in-flight", limit_options.min_limit,
                 "the adaptive limit's floor, and the calls in flight its unloaded latency is "
                 "measured at (raise it where the normal load keeps more calls in flight)")
      ->check(CLI::Range(1, 1 << 20))
      ->needs(adaptive_flag);
  app.add_option("--seed", seed, "tie-breaking seed");
  app.add_option("--startup-timeout-s", startup_timeout_s, "wait this long for the nodes");
  double slo_ms = 25;
  app.add_option("--slo-ms", slo_ms,
                 "latency objective of a Recommend answer, for SLO attainment in the metrics "
                 "(hlem_router_slo_requests_total; the local profile's 25 ms by default)")
      ->check(CLI::Range(0.001, 600000.0));
  hlem::TlsConfig tls;
  hlem::AddTlsFlags(app, &tls);
  int grpc_max_threads = hlem::GrpcServerOptions{}.max_threads;
  hlem::AddServerThreadsFlag(app, &grpc_max_threads);
  std::string frontend_token_file, admin_token_file;
  app.add_option("--frontend-token-file", frontend_token_file,
                 "file holding the bearer token Recommend and GetRoutingState require ('' = "
                 "none; re-read when it changes)");
  app.add_option("--admin-token-file", admin_token_file,
                 "file holding the bearer token sent to the nodes' admin port (residency "
                 "snapshots)");
  double drain_seconds = 2;
  app.add_option("--drain-timeout", drain_seconds,
                 "seconds SIGTERM waits for Recommend calls in flight")
      ->check(CLI::Range(0.0, 3600.0));
  if (const std::optional<int> rc = hlem::ParseCommandLine(app, argc, argv)) return *rc;

  hlem::InstallShutdownSignals();
  if (auto s = hlem::InitLogging({.level = log_level}); !s.ok()) return Fail(s);
  auto log = hlem::GetLogger("router");
  if (auto s = tls.Validate(); !s.ok()) return Fail(s);
  auto frontend_token = hlem::OpenRequiredToken(frontend_token_file, "--frontend-token-file");
  if (!frontend_token.ok()) return Fail(frontend_token.status());
  auto admin_token = hlem::OpenRequiredToken(admin_token_file, "--admin-token-file");
  if (!admin_token.ok()) return Fail(admin_token.status());
  const hlem::ChannelOptions node_channel{.tls = tls};
  auto policy_kind = hlem::router::ParsePolicy(policy);
  if (!policy_kind.ok()) return Fail(policy_kind.status());
  auto resolver = hlem::MakeResolver(nodes_flag);
  if (!resolver.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--nodes: ", resolver.status().message())));
  }

  hlem::RealClock clock;
  // Checked before the nodes are waited for: a bad combination of flags fails at once.
  std::unique_ptr<hlem::router::ConcurrencyLimit> concurrency_limit;
  if (adaptive_in_flight) {
    // --max-in-flight becomes the adaptive limit's ceiling (one count of the calls in flight),
    // and so do the gRPC server's threads: beyond them gRPC refuses, and a limit above what can
    // be in flight would never be reached, so never shrink.
    const char* ceiling = "the default maximum";
    if (max_in_flight > 0) {
      limit_options.max_limit = max_in_flight;
      ceiling = "--max-in-flight";
      max_in_flight = 0;
    }
    if (grpc_max_threads > 0 && static_cast<uint32_t>(grpc_max_threads) < limit_options.max_limit) {
      limit_options.max_limit = static_cast<uint32_t>(grpc_max_threads);
      ceiling = "--grpc-max-threads";
    }
    if (limit_options.max_limit < limit_options.min_limit) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--adaptive-min-in-flight: ", limit_options.min_limit, " is above ", ceiling,
                       " (", limit_options.max_limit, ")")));
    }
    limit_options.initial_limit =
        std::clamp(limit_options.initial_limit, limit_options.min_limit, limit_options.max_limit);
    if (const absl::Status st = hlem::router::ConcurrencyLimit::Validate(limit_options); !st.ok()) {
      return Fail(st);
    }
    concurrency_limit = std::make_unique<hlem::router::ConcurrencyLimit>(limit_options, clock);
    log->info("adaptive_in_flight min={} max={} initial={} tolerance={} percentile={}",
              limit_options.min_limit, limit_options.max_limit, limit_options.initial_limit,
              limit_options.tolerance, limit_options.percentile);
  }

  // The cluster's feature tables (their residency shard sizes) from the first node that answers;
  // every node that joins later must have the same.
  absl::StatusOr<v1::NodeInfo> first = absl::UnavailableError("no node resolved");
  const absl::Time give_up = absl::Now() + absl::Seconds(startup_timeout_s);
  while (true) {
    absl::StatusOr<std::vector<std::string>> addresses = (*resolver)->Resolve();
    if (!addresses.ok()) first = addresses.status();
    for (const std::string& a : addresses.ok() ? *addresses : std::vector<std::string>{}) {
      auto stub = v1::ServingNode::NewStub(hlem::MakeChannel(a, node_channel));
      first = hlem::router::FetchNodeInfo(*stub, absl::Seconds(2));
      if (first.ok()) break;
    }
    if (first.ok() || absl::Now() >= give_up) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (!first.ok()) {
    return Fail(absl::Status(first.status().code(),
                             absl::StrCat("no node of ", (*resolver)->target(), " answered within ",
                                          startup_timeout_s, " s: ", first.status().message())));
  }
  hlem::router::ClusterOptions options;
  options.policy = *policy_kind;
  options.scorer = {.c_kv = c_kv,
                    .c_emb = c_emb,
                    .c_load = c_load,
                    .tau = tau,
                    .epsilon = epsilon,
                    .all_overloaded = all_overloaded == "shed"
                                          ? hlem::router::AllOverloaded::kShed
                                          : hlem::router::AllOverloaded::kLeastLoaded};
  options.profile_top_k = top_k;
  options.speculative_ttl = absl::Milliseconds(speculative_ttl_ms);
  options.max_report_age = absl::Milliseconds(max_report_age_ms);
  options.in_flight_capacity = in_flight_capacity;
  options.seed = seed;
  options.h_emb_by_events = h_emb == "events";
  options.features = hlem::router::FeaturesOf(*first);
  auto cluster = hlem::router::Cluster::Create(options, clock);
  if (!cluster.ok()) return Fail(cluster.status());

  hlem::MetricsRegistry registry;
  hlem::router::RouterMetrics metrics(registry, options.policy, slo_ms / 1e3);
  std::unique_ptr<hlem::MetricsExposer> exposer;
  if (!metrics_listen.empty()) {
    auto created = hlem::MetricsExposer::Create(metrics_listen, registry);
    if (!created.ok()) return Fail(created.status());
    exposer = std::move(*created);
  }
  std::unique_ptr<hlem::router::CostCalibrator> calibrator;
  if (calibrate) {
    auto created =
        hlem::router::CostCalibrator::Create({.half_life = calibration_half_life}, options.scorer);
    if (!created.ok()) return Fail(created.status());
    calibrator = std::move(*created);
  }
  hlem::router::RouterServiceImpl service({.max_candidates = max_candidates,
                                           .max_history_events = max_history_events,
                                           .retry = retry,
                                           .retry_budget = retry_budget,
                                           .max_in_flight = max_in_flight,
                                           .concurrency_limit = concurrency_limit.get(),
                                           .calibrator = calibrator.get(),
                                           .frontend_token = frontend_token->get()},
                                          **cluster, &metrics);
  // Membership: nodes join when they answer health checks and GetNodeInfo, and leave when they
  // stop answering or the name no longer resolves to them.
  hlem::router::NodeLinks links(**cluster, service, clock, node_channel, *admin_token);
  hlem::GrpcHealthProbe probe(node_channel);
  auto membership = hlem::Membership::Create(
      {.interval = absl::Seconds(discovery_interval_s),
       .probe_timeout = absl::Seconds(std::min(1.0, discovery_interval_s)),
       .unhealthy_to_leave = unhealthy_to_leave},
      **resolver, probe, [&](const std::string& address, bool joined) {
        if (!joined) {
          links.Leave(address);
          return true;
        }
        const absl::Status st = links.Join(address);
        if (!st.ok()) log->warn("node_refused address={} reason={}", address, st.ToString());
        return st.ok();
      });
  if (!membership.ok()) return Fail(membership.status());
  (*membership)->Poll();  // the nodes up now join before the router serves

  hlem::GrpcServerOptions server_options;
  server_options.listen = listen;
  server_options.health_listen = health_listen;
  server_options.max_message_bytes = 64 << 20;
  server_options.max_receive_bytes =
      hlem::MaxScoringRequestBytes(max_history_events, max_candidates, options.features.size());
  server_options.tls = tls;
  server_options.max_threads = grpc_max_threads;
  // In-flight Recommend calls carry deadlines of the order of the SLO; a longer grace would only
  // wait for idle client channels to answer the GOAWAY (docs/node.md, SIGTERM).
  server_options.drain_timeout = absl::Seconds(drain_seconds);
  auto server = hlem::GrpcServer::Create(server_options, {&service});
  if (!server.ok()) return Fail(server.status());
  hlem::WritePortsFile(ports_file, {{"grpc", (*server)->port()},
                                    {"metrics", exposer ? exposer->port() : 0},
                                    {"health", (*server)->health_port()}});
  log->info("serving grpc_port={} policy={} nodes={} discovery={}", (*server)->port(), policy,
            links.size(), (*resolver)->target());
  (*membership)->Start();

  // Calibrated weights into the scorer, the cluster's gauges into Prometheus, once a second.
  auto refresher = std::make_unique<hlem::PeriodicThread>(absl::Seconds(1), [&] {
    if (calibrator != nullptr) {
      const hlem::router::CalibrationState st = calibrator->State();
      if (st.calibrated) {
        if (const absl::Status s = (*cluster)->SetWeights(st.weights); !s.ok()) {
          log->warn("calibration: {}", s.ToString());
        }
      }
    }
    metrics.Refresh(**cluster);
    if (concurrency_limit != nullptr) {
      const hlem::router::ConcurrencyLimitStats s = concurrency_limit->Stats();
      if (metrics.RefreshLimit(s) > 0) {
        log->warn(
            "adaptive_in_flight_forced_baseline baseline_ms={:.3f}: the router was busy (no call "
            "started with fewer than {} in flight) for {} s ({} s before the first baseline); "
            "calls beyond {} are refused until {} have run uncrowded",
            absl::ToDoubleMilliseconds(s.baseline), limit_options.min_limit,
            absl::ToDoubleSeconds(limit_options.rebaseline_every),
            absl::ToDoubleSeconds(limit_options.first_baseline_within), limit_options.min_limit,
            limit_options.baseline_samples);
      }
    }
  });

  hlem::WaitForShutdownSignal(**server);
  refresher.reset();
  (*membership)->Stop();
  log->info("shutdown_done");
  return 0;
}
