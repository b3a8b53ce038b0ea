// router: the frontend-facing entry point. Scores every serving node per request (KV residency,
// EMB locality, load, affinity; ARCHITECTURE §6) and forwards the request to the best one.
// Wiring only: flags, node discovery (a static list for now), residency subscriptions, service,
// signals.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/periodic.h"
#include "grpcpp/client_context.h"
#include "router/core/cluster.h"
#include "router/core/residency_sync.h"
#include "router/service/grpc_feed.h"
#include "router/service/router_metrics.h"
#include "router/service/router_service.h"

namespace {

namespace v1 = ::hlem::v1;

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "router: %s\n", std::string(status.ToString()).c_str());
  return 2;
}

// GetNodeInfo, retried until `timeout` (nodes may still be starting).
absl::StatusOr<v1::NodeInfo> Info(v1::ServingNode::Stub& stub, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::NodeInfo info;
    const grpc::Status st = stub.GetNodeInfo(&ctx, v1::GetNodeInfoRequest(), &info);
    if (st.ok()) return info;
    if (absl::Now() >= give_up) return hlem::FromGrpcStatus(st);
    absl::SleepFor(absl::Milliseconds(200));
  }
}

struct NodeLink {
  int index = -1;
  std::shared_ptr<v1::ServingNode::Stub> stub;
  std::unique_ptr<hlem::router::GrpcResidencyFeed> feed;
  std::unique_ptr<hlem::router::ResidencySync> sync;
  std::thread thread;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"HLEM router"};
  std::string nodes_flag, listen = "127.0.0.1:0", metrics_listen = "127.0.0.1:0", ports_file,
                          log_level = "info", policy = "hlem", all_overloaded = "least_loaded";
  double tau = 0.85, epsilon = 0.05, c_kv = 1, c_emb = 1, c_load = 1, speculative_ttl_ms = 2000,
         max_report_age_ms = 3000, in_flight_capacity = 64, startup_timeout_s = 60;
  uint64_t seed = 1;
  uint32_t top_k = 20, max_candidates = 512, max_history_events = 1 << 16;
  bool retry = true;
  app.add_option("--nodes", nodes_flag, "comma-separated serving addresses of the nodes")
      ->required();
  app.add_option("--listen", listen, "gRPC address (port 0 = any free port)");
  app.add_option("--metrics-listen", metrics_listen, "Prometheus /metrics address ('' = off)");
  app.add_option("--ports-file", ports_file,
                 "write 'grpc=<port>' and 'metrics=<port>' here once serving");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_option("--policy", policy,
                 "hlem | round_robin | least_loaded | user_hash | kv_only | emb_only");
  app.add_option("--tau", tau, "load threshold τ")->check(CLI::Range(0.0, 1.0));
  app.add_option("--epsilon", epsilon, "affinity bonus ε")->check(CLI::Range(0.0, 1.0));
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
  app.add_option("--retry", retry, "retry once on the next-best node when a node is unavailable");
  app.add_option("--seed", seed, "tie-breaking seed");
  app.add_option("--startup-timeout-s", startup_timeout_s, "wait this long for the nodes");
  double drain_seconds = 2;
  app.add_option("--drain-timeout", drain_seconds,
                 "seconds SIGTERM waits for Recommend calls in flight")
      ->check(CLI::Range(0.0, 3600.0));
  CLI11_PARSE(app, argc, argv);

  hlem::InstallShutdownSignals();
  if (auto s = hlem::InitLogging({.level = log_level}); !s.ok()) return Fail(s);
  auto log = hlem::GetLogger("router");
  auto policy_kind = hlem::router::ParsePolicy(policy);
  if (!policy_kind.ok()) return Fail(policy_kind.status());
  std::vector<std::string> addresses = absl::StrSplit(nodes_flag, ',', absl::SkipEmpty());
  if (addresses.empty()) return Fail(absl::InvalidArgumentError("--nodes: none"));

  hlem::RealClock clock;
  // Every node's identity and feature tables; the router needs their residency shard sizes.
  std::vector<NodeLink> links(addresses.size());
  std::vector<v1::NodeInfo> infos;
  for (size_t i = 0; i < addresses.size(); ++i) {
    links[i].stub = v1::ServingNode::NewStub(hlem::MakeChannel(addresses[i]));
    auto info = Info(*links[i].stub, absl::Seconds(startup_timeout_s));
    if (!info.ok()) {
      return Fail(absl::Status(info.status().code(),
                               absl::StrCat("node ", addresses[i], ": ", info.status().message())));
    }
    infos.push_back(*info);
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
  for (const v1::FeatureTable& t : infos[0].feature_tables()) {
    options.features.push_back({t.table_id(), t.residency_shard_rows()});
  }
  for (size_t i = 1; i < infos.size(); ++i) {
    bool same = infos[i].feature_tables_size() == infos[0].feature_tables_size();
    for (int f = 0; same && f < infos[i].feature_tables_size(); ++f) {
      same = infos[i].feature_tables(f).table_id() == infos[0].feature_tables(f).table_id() &&
             infos[i].feature_tables(f).residency_shard_rows() ==
                 infos[0].feature_tables(f).residency_shard_rows();
    }
    if (!same) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("node ", addresses[i], " has other feature tables than ", addresses[0])));
    }
  }
  auto cluster = hlem::router::Cluster::Create(options, clock);
  if (!cluster.ok()) return Fail(cluster.status());

  hlem::MetricsRegistry registry;
  hlem::router::RouterMetrics metrics(registry, options.policy);
  std::unique_ptr<hlem::MetricsExposer> exposer;
  if (!metrics_listen.empty()) {
    auto created = hlem::MetricsExposer::Create(metrics_listen, registry);
    if (!created.ok()) return Fail(created.status());
    exposer = std::move(*created);
  }
  hlem::router::RouterServiceImpl service(
      {.max_candidates = max_candidates,
       .max_history_events = max_history_events,
       .retry = retry,
       .features = static_cast<size_t>(infos[0].feature_tables_size())},
      **cluster, &metrics);
  for (size_t i = 0; i < links.size(); ++i) {
    auto index = (*cluster)->AddNode(infos[i].node_id(), addresses[i]);
    if (!index.ok()) return Fail(index.status());
    NodeLink& link = links[i];
    link.index = *index;
    service.SetNodeStub(link.index, link.stub);
    const std::string host = addresses[i].substr(0, addresses[i].rfind(':'));
    auto admin = v1::ServingNodeAdmin::NewStub(
        hlem::MakeChannel(absl::StrCat(host, ":", infos[i].admin_port())));
    link.feed = std::make_unique<hlem::router::GrpcResidencyFeed>(
        link.stub, std::shared_ptr<v1::ServingNodeAdmin::Stub>(std::move(admin)), "router");
    link.sync =
        std::make_unique<hlem::router::ResidencySync>(**cluster, link.index, *link.feed, clock);
    link.thread = std::thread([&link] { link.sync->Run(); });
    log->info("node id={} address={} admin_port={} epoch={}", infos[i].node_id(), addresses[i],
              infos[i].admin_port(), infos[i].incarnation_epoch());
  }

  hlem::GrpcServerOptions server_options;
  server_options.listen = listen;
  server_options.max_message_bytes = 64 << 20;
  // In-flight Recommend calls carry deadlines of the order of the SLO; a longer grace would only
  // wait for idle client channels to answer the GOAWAY (docs/node.md, SIGTERM).
  server_options.drain_timeout = absl::Seconds(drain_seconds);
  auto server = hlem::GrpcServer::Create(server_options, {&service});
  if (!server.ok()) return Fail(server.status());
  if (!ports_file.empty()) {
    const std::string tmp = ports_file + ".tmp";
    {
      std::ofstream out(tmp);
      out << "grpc=" << (*server)->port() << "\n"
          << "metrics=" << (exposer ? exposer->port() : 0) << "\n";
    }
    std::rename(tmp.c_str(), ports_file.c_str());
  }
  log->info("serving grpc_port={} policy={} nodes={}", (*server)->port(), policy, links.size());

  // The cluster's gauges into Prometheus once a second.
  auto refresher =
      std::make_unique<hlem::PeriodicThread>(absl::Seconds(1), [&] { metrics.Refresh(**cluster); });

  hlem::WaitForShutdownSignal(**server);
  refresher.reset();
  for (NodeLink& link : links) link.sync->Stop();
  for (NodeLink& link : links) link.thread.join();
  log->info("shutdown_done");
  return 0;
}
