// allocator: every interval reads each serving node's closed windows (GetState), decides its α
// with the configured controller and pushes it (SetAlpha on the node's admin port) with this
// allocator's epoch (ARCHITECTURE §3). Wiring only: flags, node membership (a static list or a
// DNS name, health-checked, as the router's), the controller, the round loop, the read-only
// Allocator service, metrics, signals. Nodes keep their last α whenever the allocator is away.

#include <unistd.h>
#include <CLI/CLI.hpp>
#include <optional>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "allocator_service/core/allocator.h"
#include "allocator_service/core/controller.h"
#include "allocator_service/core/registry.h"
#include "allocator_service/service/allocator_service.h"
#include "allocator_service/service/grpc_nodes.h"
#include "common/cli.h"
#include "common/clock.h"
#include "common/grpc_flags.h"
#include "common/grpc_health_probe.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/membership.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/request_limits.h"
#include "router/service/node_links.h"

namespace {

namespace v1 = ::hlem::v1;
namespace alloc = ::hlem::allocator;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "allocator: %s\n", std::string(status.ToString()).c_str());
  return 2;
}

// "host:port" → "host:<admin_port>" (IPv6 "[..]:port" alike).
std::string AdminAddress(const std::string& address, uint32_t admin_port) {
  return absl::StrCat(address.substr(0, address.rfind(':')), ":", admin_port);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"HLEM allocator"};
  std::string nodes_flag, listen = "127.0.0.1:0", metrics_listen = "127.0.0.1:0", ports_file,
                          health_listen, log_level = "info", controller = "hlem", weights,
                          allocator_id;
  double interval_s = 5, rpc_timeout_ms = 1000, alpha = 0.5, alpha_min = 0.1, alpha_max = 0.9,
         discovery_interval_s = 2, deadband = alloc::ControllerSpec{}.deadband;
  uint64_t epoch = 0;
  app.add_option("--nodes", nodes_flag,
                 "the nodes' serving addresses: host:port,host:port,... or dns:///name:port")
      ->required();
  app.add_option("--controller", controller,
                 "hlem (SmartAllocator: PPO base policy + online adapter + recovery), ppo "
                 "(PPO-only), ppo+adapter, ppo+recovery, static, kv_only (α = 0), recovery "
                 "(recovery around the static α), and the baselines pid, bo, milp, xgboost, lstm "
                 "(the LSTM inside recovery)")
      ->check(CLI::IsMember(std::vector<std::string>(alloc::kControllerNames.begin(),
                                                     alloc::kControllerNames.end())));
  app.add_option("--weights", weights,
                 "the PPO actor (hlem-mlp; hlem train-ppo --out), for hlem and ppo*");
  app.add_option("--alpha", alpha, "the static α (static, recovery)")->check(CLI::Range(0.0, 1.0));
  app.add_option("--alpha-min", alpha_min, "lower bound of α for the learned controllers and PID")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--alpha-max", alpha_max, "upper bound of α")->check(CLI::Range(0.0, 1.0));
  app.add_option("--deadband", deadband, alloc::kDeadbandHelp)->check(CLI::Range(0.0, 1.0));
  app.add_option("--interval-s", interval_s, "decision interval (the nodes' window)")
      ->check(CLI::Range(0.05, 3600.0));
  app.add_option("--rpc-timeout-ms", rpc_timeout_ms, "deadline of each GetState and SetAlpha")
      ->check(CLI::Range(1.0, 600000.0));
  app.add_option("--discovery-interval-s", discovery_interval_s,
                 "how often the node list is resolved and health-checked")
      ->check(CLI::Range(0.01, 3600.0));
  app.add_option("--epoch", epoch,
                 "allocator epoch sent with SetAlpha (default: microseconds since 1970 at start, "
                 "so a restarted allocator's is larger)");
  app.add_option("--allocator-id", allocator_id, "name in the nodes' logs (default host-pid)");
  app.add_option("--listen", listen, "gRPC address (port 0 = any free port)");
  app.add_option("--metrics-listen", metrics_listen, "Prometheus /metrics address ('' = off)");
  app.add_option("--health-listen", health_listen, hlem::kHealthListenHelp);
  app.add_option("--ports-file", ports_file,
                 "write 'grpc=<port>', 'metrics=<port>' and 'health=<port>' here once serving");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  int grpc_max_threads = hlem::GrpcServerOptions{}.max_threads;
  hlem::AddServerThreadsFlag(app, &grpc_max_threads);
  hlem::ClientSecurityFlags security;
  hlem::AddClientSecurityFlags(
      app, &security, "--admin-token-file",
      "file holding the bearer token sent to the nodes' admin port (re-read when it changes)");
  if (const std::optional<int> rc = hlem::ParseCommandLine(app, argc, argv)) return *rc;

  hlem::InstallShutdownSignals();
  if (auto s = hlem::InitLogging({.level = log_level}); !s.ok()) return Fail(s);
  auto log = hlem::GetLogger("allocator");
  // The controller, checked once here: a bad config is a start-up error.
  const alloc::Bounds bounds{.alpha_min = alpha_min, .alpha_max = alpha_max};
  absl::StatusOr<alloc::ControllerFactory> make =
      alloc::MakeControllerFactory({.name = controller,
                                    .weights = weights,
                                    .alpha = alpha,
                                    .bounds = bounds,
                                    .deadband = deadband});
  if (!make.ok()) return Fail(make.status());
  auto resolver = hlem::MakeResolver(nodes_flag);
  if (!resolver.ok()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--nodes: ", resolver.status().message())));
  }
  if (epoch == 0) epoch = static_cast<uint64_t>(absl::ToUnixMicros(absl::Now()));
  if (allocator_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    allocator_id = absl::StrCat(host, "-", getpid());
  }

  hlem::RealClock& clock = hlem::RealClock::Get();
  auto admin_channel = hlem::ResolveChannelOptions(security, "--admin-token-file");
  if (!admin_channel.ok()) return Fail(admin_channel.status());
  const hlem::ChannelOptions node_channel{.tls = security.tls};
  alloc::GrpcNodeApi api(16, node_channel, *admin_channel);
  auto allocator = alloc::Allocator::Create({.interval = absl::Seconds(interval_s),
                                             .rpc_timeout = absl::Milliseconds(rpc_timeout_ms),
                                             .epoch = epoch,
                                             .allocator_id = allocator_id,
                                             .controller = controller},
                                            api, clock, *make);
  if (!allocator.ok()) return Fail(allocator.status());

  hlem::MetricsRegistry registry;
  alloc::AllocatorMetrics metrics(registry);
  std::unique_ptr<hlem::MetricsExposer> exposer;
  if (!metrics_listen.empty()) {
    auto created = hlem::MetricsExposer::Create(metrics_listen, registry);
    if (!created.ok()) return Fail(created.status());
    exposer = std::move(*created);
  }
  // Membership as the router's: a node joins once it answers health checks and GetNodeInfo
  // (which names its admin port) and leaves when it stops answering.
  hlem::GrpcHealthProbe probe(node_channel);
  auto membership = hlem::Membership::Create(
      {.interval = absl::Seconds(discovery_interval_s),
       .probe_timeout = absl::Seconds(std::min(1.0, discovery_interval_s))},
      **resolver, probe, [&](const std::string& address, bool joined) {
        if (!joined) {
          (*allocator)->RemoveNode(address);
          log->info("node_left address={}", address);
          return true;
        }
        auto stub = v1::ServingNode::NewStub(hlem::MakeChannel(address, node_channel));
        absl::StatusOr<v1::NodeInfo> info = hlem::router::FetchNodeInfo(*stub, absl::Seconds(2));
        if (!info.ok() || info->admin_port() == 0) {
          log->warn("node_refused address={} reason={}", address,
                    info.ok() ? "no admin port" : info.status().ToString());
          return false;
        }
        (*allocator)
            ->AddNode(
                {.address = address, .admin_address = AdminAddress(address, info->admin_port())});
        log->info("node_joined address={} node={} admin_port={}", address, info->node_id(),
                  info->admin_port());
        return true;
      });
  if (!membership.ok()) return Fail(membership.status());
  (*membership)->Poll();

  alloc::AllocatorServiceImpl service(**allocator, {.controller = controller,
                                                    .policy_weights = weights,
                                                    .bounds = bounds,
                                                    .started_at = absl::Now()});
  hlem::GrpcServerOptions server_options;
  server_options.listen = listen;
  server_options.health_listen = health_listen;
  server_options.tls = security.tls;
  server_options.max_threads = grpc_max_threads;
  // Its requests are a few small fields each.
  server_options.max_receive_bytes = hlem::kMinReceiveBytes;
  auto server = hlem::GrpcServer::Create(server_options, {&service});
  if (!server.ok()) return Fail(server.status());
  hlem::WritePortsFile(ports_file, {{"grpc", (*server)->port()},
                                    {"metrics", exposer ? exposer->port() : 0},
                                    {"health", (*server)->health_port()}});
  log->info("serving grpc_port={} controller={} interval_s={} epoch={} nodes={} discovery={}",
            (*server)->port(), controller, interval_s, epoch, (*allocator)->Nodes().size(),
            (*resolver)->target());
  (*membership)->Start();

  // The rounds, on their own thread: one every interval, on the wall clock's grid.
  absl::Notification stop;
  std::thread rounds([&] {
    absl::Time next = absl::Now();
    while (!stop.WaitForNotificationWithDeadline(next)) {
      const alloc::RoundStats r = (*allocator)->RunRound();
      metrics.AfterRound(r, **allocator, controller);
      if (r.poll_failed > 0 || r.push_failed > 0) {
        log->warn("round={} nodes={} poll_failed={} push_failed={}", r.round, r.nodes,
                  r.poll_failed, r.push_failed);
      }
      next += absl::Seconds(interval_s);
      if (next < absl::Now()) next = absl::Now();  // a round longer than the interval
    }
  });

  hlem::WaitForShutdownSignal(**server);
  stop.Notify();
  rounds.join();
  (*membership)->Stop();
  log->info("shutdown_done");
  return 0;
}
