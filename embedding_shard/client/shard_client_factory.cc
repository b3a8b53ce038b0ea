#include "embedding_shard/client/shard_client_factory.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "embedding_shard/client/grpc_transport.h"
#include "embedding_shard/client/shard_client_metrics.h"
#include "embedding_shard/core/shard_map.h"
#include "embedding_shard/service/shard_service.h"

namespace hlem::shard {
namespace {

absl::Status CheckAgrees(const ShardClusterConfig& cluster, const hlem::v1::ShardInfo& info,
                         uint32_t index) {
  std::string where = absl::StrCat("shard ", index, ": ");
  if (info.shard_index() != index || info.num_shards() != cluster.map.num_shards ||
      info.replicas() != cluster.map.replicas ||
      info.partition() != PartitioningName(cluster.map.partitioning)) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, "serves shard ", info.shard_index(), " of ", info.num_shards(), " (",
        info.partition(), ", ", info.replicas(), " replicas); the config expects shard ", index,
        " of ", cluster.map.num_shards, " (", PartitioningName(cluster.map.partitioning), ", ",
        cluster.map.replicas, " replicas)"));
  }
  for (const TableSpec& spec : cluster.tables) {
    bool found = false;
    for (const auto& t : info.tables()) {
      if (t.table_id() != spec.id) continue;
      found = t.rows() == spec.rows && t.dim() == spec.dim && FromProto(t.dtype()) == spec.dtype;
      if (!found) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, "table ", spec.id, " has a different shape than the config"));
      }
    }
    if (!found) {
      return absl::FailedPreconditionError(absl::StrCat(where, "lacks table ", spec.id));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClientTransport> ParseClientTransport(absl::string_view name) {
  if (name == "ucx") return ClientTransport::kUcx;
  if (name == "grpc") return ClientTransport::kGrpc;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "'; allowed: ucx, grpc"));
}

absl::StatusOr<RdmaServerInfo> FetchRdmaServerInfo(GrpcShardTransport& grpc, uint32_t server,
                                                   absl::Time deadline) {
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  hlem::v1::RdmaInfo info;
  absl::Status status = FromGrpcStatus(
      grpc.stub(server).GetRdmaInfo(&context, hlem::v1::GetRdmaInfoRequest(), &info));
  if (!status.ok()) return status;
  RdmaServerInfo out;
  out.worker_address = info.worker_address();
  out.host_id = info.host_id();
  out.transports.assign(info.transports().begin(), info.transports().end());
  for (const auto& r : info.regions()) {
    out.regions.push_back(RdmaRegionInfo{r.table_id(), r.partition(), r.base_address(), r.rkey(),
                                         r.stride_bytes(), r.first_slot(), r.num_slots()});
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ShardClient>> ConnectShardClient(const ShardClientSetup& setup,
                                                                Clock& clock) {
  std::vector<std::string> addresses =
      setup.addresses.empty() ? setup.cluster.servers : setup.addresses;
  if (addresses.size() != setup.cluster.map.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("need ", setup.cluster.map.num_shards,
                                                   " shard addresses, got ", addresses.size()));
  }
  auto grpc = std::make_shared<GrpcShardTransport>(addresses, setup.tls);
  ASSIGN_OR_RETURN(const ShardMap map, ShardMap::Create(setup.cluster.map));
  // Every server is asked at once, each call waiting for its server to come up (up to
  // connect_timeout). Once the servers that answered hold every partition, the others get
  // `straggler_grace` more and are then given up (marked down, probed in the background): a dead
  // replica does not hold up a start, a cluster that is still starting is waited for.
  const size_t n = addresses.size();
  std::vector<grpc::ClientContext> contexts(n);
  std::vector<hlem::v1::ShardInfo> infos(n);
  std::vector<absl::Status> results(n, absl::UnknownError("no answer"));
  std::vector<bool> answered(n, false);
  absl::Mutex mu;
  size_t done = 0;
  std::vector<std::thread> calls;
  calls.reserve(n);
  for (uint32_t s = 0; s < n; ++s) {
    contexts[s].set_wait_for_ready(true);
    SetDeadline(contexts[s], clock.Now() + setup.connect_timeout);
    calls.emplace_back([&, s] {
      absl::Status status = FromGrpcStatus(
          grpc->stub(s).GetShardInfo(&contexts[s], hlem::v1::GetShardInfoRequest(), &infos[s]));
      absl::MutexLock lock(&mu);
      answered[s] = status.ok();
      results[s] = std::move(status);
      ++done;
    });
  }
  absl::Time covered_at = absl::InfiniteFuture();
  for (;;) {
    {
      absl::MutexLock lock(&mu);
      if (done == n) break;
      if (covered_at == absl::InfiniteFuture()) {
        bool covered = true;
        for (uint32_t p = 0; p < map.num_shards() && covered; ++p) {
          const std::vector<uint32_t> holders = map.ServersOf(p);
          covered = std::any_of(holders.begin(), holders.end(),
                                [&](uint32_t h) { return h < n && answered[h]; });
        }
        if (covered) covered_at = absl::Now();
      }
      if (absl::Now() >= covered_at + setup.straggler_grace) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (grpc::ClientContext& context : contexts) context.TryCancel();  // the stragglers, if any
  for (std::thread& call : calls) call.join();
  absl::Status last_error;
  int reachable = 0;
  for (uint32_t s = 0; s < n; ++s) {
    if (!results[s].ok()) {
      last_error = absl::Status(results[s].code(), absl::StrCat("shard ", s, " at ", addresses[s],
                                                                ": ", results[s].message()));
      continue;
    }
    if (absl::Status agrees = CheckAgrees(setup.cluster, infos[s], s); !agrees.ok()) return agrees;
    ++reachable;
  }
  if (reachable == 0) return last_error;

  ShardClientOptions options = ClientOptionsFor(setup.cluster);
  options.probe_interval = setup.probe_interval;
  std::shared_ptr<ShardClientMetrics> metrics;
  if (setup.metrics != nullptr) {
    metrics = std::make_shared<ShardClientMetrics>(
        *setup.metrics, setup.transport == ClientTransport::kUcx ? "ucx" : "grpc");
    options.observer = metrics;
    for (uint32_t s = 0; s < addresses.size(); ++s) metrics->OnServerHealth(s, true);
  }
  std::unique_ptr<ShardTransport> transport;
  if (setup.transport == ClientTransport::kGrpc) {
    transport = std::make_unique<GrpcShardTransport>(addresses, setup.tls);
  } else {
    UcxShardTransport::Options ucx;
    ucx.ucx = setup.cluster.ucx;
    ucx.mode = setup.ucx_mode;
    ucx.num_servers = setup.cluster.map.num_shards;
    ucx.map = setup.cluster.map;
    if (metrics) {
      ucx.on_connected = [metrics](uint32_t s, const std::vector<std::string>& transports) {
        metrics->SetEndpointTransports(s, transports);
      };
    }
    auto fetch = [grpc, &clock](uint32_t s) {
      return FetchRdmaServerInfo(*grpc, s, clock.Now() + absl::Seconds(5));
    };
    auto probe = [grpc](uint32_t s, absl::Time deadline) { return grpc->Probe(s, deadline); };
    auto created = UcxShardTransport::Create(ucx, fetch, probe);
    if (!created.ok()) return created.status();
    transport = std::move(*created);
  }
  auto client = ShardClient::Create(options, std::move(transport), clock);
  if (!client.ok()) return client.status();
  (*client)->ProbeAll();  // mark unreachable servers down before the first request
  return client;
}

}  // namespace hlem::shard
