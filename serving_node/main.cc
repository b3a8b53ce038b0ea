// serving_node: one serving node (HSTU with exact KV reuse over one paged pool shared by the KV
// cache and the EMB cache) on the cpu device or a GPU (memory.device: cuda), reading embedding rows
// from the shard cluster. Wiring only: flags, config, shard client, node stack, services, metrics,
// signals.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cli.h"
#include "common/clock.h"
#include "common/grpc_flags.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/periodic.h"
#include "common/process.h"
#include "common/request_limits.h"
#include "embedding_shard/client/shard_client_factory.h"
#include "serving_node/service/node_config.h"
#include "serving_node/service/node_metrics.h"
#include "serving_node/service/node_service.h"
#include "serving_node/service/node_stack.h"
#include "serving_node/service/shard_row_source.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "serving_node: %s\n", std::string(status.ToString()).c_str());
  return 2;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "cpu";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string compute_note = hlem::serving::TuneComputeProcess(argv);  // may re-exec
  CLI::App app{"HLEM serving node"};
  std::string config_path, listen = "127.0.0.1:0", admin_listen = "127.0.0.1:0",
                           metrics_listen = "127.0.0.1:0", ports_file, log_level = "info", node_id,
                           health_listen;
  app.add_option("--config", config_path, "node config YAML (node, memory, model, shards)")
      ->required();
  app.add_option("--node-id", node_id, "overrides node.id");
  app.add_option("--listen", listen, "serving gRPC address (port 0 = any free port)");
  app.add_option("--admin-listen", admin_listen, "admin gRPC address (SetAlpha, Drain, Snapshot)");
  app.add_option("--metrics-listen", metrics_listen, "Prometheus /metrics address ('' = off)");
  app.add_option("--health-listen", health_listen, hlem::kHealthListenHelp);
  app.add_option("--ports-file", ports_file,
                 "write 'grpc=<port>', 'admin=<port>', 'metrics=<port>' and 'health=<port>' here "
                 "once serving");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  double drain_seconds = 10;
  app.add_option("--drain-timeout", drain_seconds,
                 "seconds SIGTERM waits for admitted requests before stopping")
      ->check(CLI::Range(0.0, 3600.0));
  std::vector<std::string> shard_servers;
  app.add_option("--shard-servers", shard_servers,
                 "gRPC address per shard index (overrides shards.servers)")
      ->delimiter(',');
  hlem::TlsConfig tls;
  hlem::AddTlsFlags(app, &tls);
  int grpc_max_threads = hlem::GrpcServerOptions{}.max_threads;
  hlem::AddServerThreadsFlag(app, &grpc_max_threads);
  std::string admin_token_file;
  app.add_option("--admin-token-file", admin_token_file,
                 "file holding the bearer token the admin port requires ('' = none; re-read when "
                 "it changes)");
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "load and validate the config (and its shards file), print a summary, exit: 0 if "
               "valid, 2 naming the field if not");
  if (const std::optional<int> rc = hlem::ParseCommandLine(app, argc, argv)) return *rc;

  hlem::InstallShutdownSignals();
  if (auto s = hlem::InitLogging({.level = check_config ? "warn" : log_level}); !s.ok()) {
    return Fail(s);
  }
  auto log = hlem::GetLogger("serving_node");
  log->info("compute: {}", compute_note);
  auto config = hlem::serving::LoadNodeConfig(config_path);
  if (!config.ok()) return Fail(config.status());
  if (!node_id.empty()) config->node.node_id = node_id;
  if (!shard_servers.empty()) {
    if (shard_servers.size() != config->shards.map.num_shards) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--shard-servers: ", shard_servers.size(), " addresses for ",
                       config->shards.map.num_shards, " shards")));
    }
    config->shard_servers = shard_servers;
  }
  if (auto s = tls.Validate(); !s.ok()) return Fail(s);
  auto admin_token = hlem::OpenRequiredToken(admin_token_file, "--admin-token-file");
  if (!admin_token.ok()) return Fail(admin_token.status());
  if (admin_token_file.empty() && !hlem::IsLoopbackAddress(admin_listen)) {
    log->warn(
        "admin_unprotected admin_listen={}: SetAlpha, Drain and Snapshot answer anyone who reaches "
        "this port; pass --admin-token-file (docs/reliability.md) or keep the port closed (the "
        "Kubernetes base does by NetworkPolicy)",
        admin_listen);
  }
  if (check_config) {
    std::printf("%s: valid (node %s, %s pool, %zu shards, %d-layer model)\n", config_path.c_str(),
                config->node.node_id.c_str(), config->device.c_str(),
                static_cast<size_t>(config->shards.map.num_shards), config->model.layers);
    return 0;
  }
  hlem::serving::SetComputeThreads(config->compute_threads);

  // Declared before everything that schedules on them, so they are destroyed last. `clock` runs
  // the critical path's timers (the link's completions, windows, load reports); `background` the
  // refiller and the memory manager, whose timers may block (LocalNodeOptions::background_clock);
  // `probes` the shard client's health probes and reconnects, which wait on the shards (a probe
  // of a stalled shard for its whole timeout, a reconnect for its warm-up): on `clock` they held
  // up every copy of the node meanwhile (docs/reliability.md).
  hlem::RealClock clock;
  hlem::RealClock background;
  hlem::RealClock probes;
  hlem::MetricsRegistry registry;
  std::unique_ptr<hlem::MetricsExposer> exposer;
  if (!metrics_listen.empty()) {
    auto created = hlem::MetricsExposer::Create(metrics_listen, registry);
    if (!created.ok()) return Fail(created.status());
    exposer = std::move(*created);
  }
  hlem::shard::ShardClientSetup setup;
  setup.cluster = config->shards;
  setup.addresses = config->shard_servers;
  setup.metrics = &registry;
  setup.tls = tls;
  auto transport = hlem::shard::ParseClientTransport(config->shard_transport);
  if (!transport.ok()) return Fail(transport.status());
  setup.transport = *transport;
  auto client = hlem::shard::ConnectShardClient(setup, probes);
  if (!client.ok()) return Fail(client.status());
  hlem::serving::ShardRowSource source(**client);

  // The incarnation changes with every start (start time in ns: increasing across restarts).
  const uint64_t epoch = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  hlem::serving::NodeMetrics metrics(registry, absl::ToDoubleSeconds(config->node.slo));
  config->queue.on_batch = [&metrics](size_t requests) { metrics.ObserveBatch(requests); };
  auto stack = hlem::serving::NodeStack::Build(*config, source, epoch, clock, &background);
  if (!stack.ok()) return Fail(stack.status());
  hlem::serving::NodeStack& s = **stack;
  s.node->SetAnswerObserver(
      [&metrics](const hlem::serving::NodeAnswer& a) { metrics.ObserveAnswer(a); });
  s.Start();

  hlem::serving::NodeDescription description{
      .device = config->device,
      .device_name = config->device == "cpu" ? CpuModel() : s.device->name(),
      .model_name = config->model_name,
      .model_layers = config->model.layers,
      .model_dim = config->model.dim,
      .page_tokens = s.kv->page_tokens(),
      .residency_shard_rows = config->residency_shard_rows};
  for (size_t f = 0; f < config->features.size(); ++f) {
    description.tables.push_back({.table_id = s.features[f].table_id,
                                  .name = config->features[f],
                                  .rows = s.features[f].rows,
                                  .dim = config->model.dim});
  }
  hlem::GrpcServerOptions server_options;
  server_options.listen = listen;
  server_options.admin_listen = admin_listen;
  server_options.health_listen = health_listen;
  server_options.max_message_bytes = 64 << 20;
  server_options.max_receive_bytes = hlem::MaxScoringRequestBytes(
      config->max_request_events, config->max_candidates, config->features.size());
  server_options.tls = tls;
  server_options.max_threads = grpc_max_threads;
  // The node drains admitted requests itself (Node::Drain below); after that the gRPC server only
  // has responses to flush. Its shutdown otherwise waits for idle client channels to answer the
  // GOAWAY ping, which an idle gRPC client does only at its backup poll (every 5 s).
  server_options.drain_timeout = absl::Seconds(1);
  auto service = std::make_unique<hlem::serving::ServingNodeServiceImpl>(*s.node, description);
  hlem::serving::ServingNodeAdminImpl admin(*s.node, admin_token->get());
  auto server = hlem::GrpcServer::Create(server_options, {service.get()}, {&admin});
  if (!server.ok()) return Fail(server.status());
  service->SetAdminPort(static_cast<uint32_t>((*server)->admin_port()));

  // Gauges and cumulative counters into Prometheus once a second.
  auto refresher = std::make_unique<hlem::PeriodicThread>(absl::Seconds(1), [&] {
    metrics.Refresh(*s.node, {{"critical", clock.Stats()},
                              {"background", background.Stats()},
                              {"probes", probes.Stats()}});
  });

  hlem::WritePortsFile(ports_file, {{"grpc", (*server)->port()},
                                    {"admin", (*server)->admin_port()},
                                    {"metrics", exposer ? exposer->port() : 0},
                                    {"health", (*server)->health_port()}});
  log->info(
      "serving node={} epoch={} grpc_port={} admin_port={} metrics_port={} pool_bytes={} "
      "alpha={} model={}",
      config->node.node_id, epoch, (*server)->port(), (*server)->admin_port(),
      exposer ? exposer->port() : 0, config->pool_bytes, config->memory.initial_alpha,
      config->model_name);

  const absl::Duration drain_timeout = absl::Seconds(drain_seconds);
  hlem::WaitForShutdownSignal();
  log->info("shutdown_begin node={}", config->node.node_id);
  // Drain: report NOT_SERVING (readiness probes, the router's health checks), refuse new
  // requests, let admitted ones finish, then stop the server.
  (*server)->SetServing(false);
  const hlem::serving::DrainResult drained =
      s.node->Drain(/*wait=*/true, absl::Now() + drain_timeout);
  log->info("drain_done node={} drained={}", config->node.node_id, drained.drained);
  service->Stop();
  (*server)->Shutdown();
  log->info("server_stopped node={}", config->node.node_id);
  refresher.reset();
  log->info("shutdown_done node={} drained={} in_flight={}", config->node.node_id, drained.drained,
            drained.in_flight_requests);
  return 0;
}
