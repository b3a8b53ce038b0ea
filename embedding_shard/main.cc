// embedding_shard: serves one shard of the embedding tables over UCX (data plane) and gRPC.
// Wiring only: flags, config, UCX memory, store, services, metrics, signals.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/cli.h"
#include "common/clock.h"
#include "common/grpc_flags.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/request_limits.h"
#include "embedding_shard/core/shard_config.h"
#include "embedding_shard/core/shard_store.h"
#include "embedding_shard/service/shard_metrics.h"
#include "embedding_shard/service/shard_service.h"
#include "embedding_shard/transport/ucx_server.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "embedding_shard: %s\n", std::string(status.ToString()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"HLEM embedding shard server"};
  std::string config_path, listen = "127.0.0.1:0", metrics_listen = "127.0.0.1:0", ports_file,
                           log_level = "info", health_listen;
  uint32_t shard_index = 0;
  app.add_option("--config", config_path, "cluster config YAML (tables, shard map, ucx)")
      ->required();
  app.add_option("--shard-index", shard_index, "which shard of the map this server holds");
  app.add_option("--listen", listen, "gRPC address (port 0 = any free port)");
  app.add_option("--metrics-listen", metrics_listen, "Prometheus /metrics address ('' = off)");
  app.add_option("--health-listen", health_listen, hlem::kHealthListenHelp);
  app.add_option("--ports-file", ports_file,
                 "write 'grpc=<port>', 'metrics=<port>' and 'health=<port>' here once serving");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  hlem::TlsConfig tls;
  hlem::AddTlsFlags(app, &tls);
  int grpc_max_threads = hlem::GrpcServerOptions{}.max_threads;
  hlem::AddServerThreadsFlag(app, &grpc_max_threads);
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "load and validate the config, print a summary, exit: 0 if valid, 2 naming the "
               "field if not");
  if (const std::optional<int> rc = hlem::ParseCommandLine(app, argc, argv)) return *rc;

  hlem::InstallShutdownSignals();
  if (auto s = hlem::InitLogging({.level = check_config ? "warn" : log_level}); !s.ok()) {
    return Fail(s);
  }
  auto log = hlem::GetLogger("embedding_shard");

  auto config = hlem::shard::LoadShardClusterConfig(config_path);
  if (!config.ok()) return Fail(config.status());
  if (shard_index >= config->map.num_shards) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--shard-index ", shard_index,
                                                        " must be < shard_map.num_shards ",
                                                        config->map.num_shards)));
  }
  if (auto s = tls.Validate(); !s.ok()) return Fail(s);
  if (check_config) {
    std::printf("%s: valid (%u shards, %zu tables, ucx %s)\n", config_path.c_str(),
                static_cast<unsigned>(config->map.num_shards), config->tables.size(),
                config->ucx.enabled ? "on" : "off");
    return 0;
  }

  std::unique_ptr<hlem::shard::UcxShardServer> ucx;
  hlem::shard::HeapAllocator heap;
  hlem::shard::RegionAllocator* allocator = &heap;
  if (config->ucx.enabled) {
    auto created = hlem::shard::UcxShardServer::Create(config->ucx);
    if (!created.ok()) return Fail(created.status());
    ucx = std::move(*created);
    allocator = ucx.get();
  }
  auto load_start = absl::Now();
  auto store = hlem::shard::ShardStore::Create(hlem::shard::StoreOptionsFor(*config, shard_index),
                                               *allocator);
  if (!store.ok()) return Fail(store.status());
  log->info("store_loaded shard={} bytes={} segments={} seconds={:.2f}", shard_index,
            (*store)->resident_bytes(), (*store)->segments().size(),
            absl::ToDoubleSeconds(absl::Now() - load_start));

  hlem::MetricsRegistry registry;
  hlem::shard::ShardMetrics metrics(registry);
  metrics.SetResidentBytes(static_cast<double>((*store)->resident_bytes()));
  if (ucx) {
    auto status = ucx->Start(
        store->get(), [&metrics](size_t rows, size_t bytes, double seconds, absl::StatusCode code) {
          metrics.Observe(hlem::shard::ServeTransport::kUcxGather, rows, bytes, seconds, code);
        });
    if (!status.ok()) return Fail(status);
    metrics.SetUcxTransports(ucx->info().transports);
  }
  std::unique_ptr<hlem::MetricsExposer> exposer;
  if (!metrics_listen.empty()) {
    auto created = hlem::MetricsExposer::Create(metrics_listen, registry);
    if (!created.ok()) return Fail(created.status());
    exposer = std::move(*created);
  }

  // The incarnation changes with every start (start time in ns: increasing across restarts), so
  // clients can tell a restarted shard.
  const uint64_t incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  hlem::shard::ShardServiceImpl service(**store, ucx ? &ucx->info() : nullptr, incarnation,
                                        metrics);
  hlem::GrpcServerOptions server_options;
  server_options.listen = listen;
  server_options.health_listen = health_listen;
  server_options.max_message_bytes = hlem::shard::kMaxLookupReplyBytes;
  server_options.max_receive_bytes =
      hlem::MaxLookupRequestBytes((*store)->options().max_batch_rows);
  server_options.tls = tls;
  server_options.max_threads = grpc_max_threads;
  auto server = hlem::GrpcServer::Create(server_options, {&service});
  if (!server.ok()) return Fail(server.status());

  hlem::WritePortsFile(ports_file, {{"grpc", (*server)->port()},
                                    {"metrics", exposer ? exposer->port() : 0},
                                    {"health", (*server)->health_port()}});
  log->info("serving shard={} grpc_port={} metrics_port={} ucx={}", shard_index, (*server)->port(),
            exposer ? exposer->port() : 0, ucx != nullptr);

  hlem::WaitForShutdownSignal(**server);
  log->info("shutdown_begin shard={}", shard_index);
  if (ucx) ucx->Stop();
  log->info("shutdown_done shard={}", shard_index);
  return 0;
}
