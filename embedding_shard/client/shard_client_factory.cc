#include "embedding_shard/client/shard_client_factory.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "embedding_shard/client/grpc_transport.h"
#include "embedding_shard/client/shard_client_metrics.h"
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

absl::StatusOr<std::unique_ptr<ShardClient>> ConnectShardClient(const ShardClientSetup& setup,
                                                                Clock& clock) {
  std::vector<std::string> addresses =
      setup.addresses.empty() ? setup.cluster.servers : setup.addresses;
  if (addresses.size() != setup.cluster.map.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("need ", setup.cluster.map.num_shards,
                                                   " shard addresses, got ", addresses.size()));
  }
  auto grpc = std::make_shared<GrpcShardTransport>(addresses);
  absl::Status last_error;
  int reachable = 0;
  for (uint32_t s = 0; s < addresses.size(); ++s) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    SetDeadline(context, clock.Now() + setup.connect_timeout);
    hlem::v1::ShardInfo info;
    absl::Status status = FromGrpcStatus(
        grpc->stub(s).GetShardInfo(&context, hlem::v1::GetShardInfoRequest(), &info));
    if (!status.ok()) {
      last_error = absl::Status(
          status.code(), absl::StrCat("shard ", s, " at ", addresses[s], ": ", status.message()));
      continue;
    }
    if (absl::Status agrees = CheckAgrees(setup.cluster, info, s); !agrees.ok()) return agrees;
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
    transport = std::make_unique<GrpcShardTransport>(addresses);
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
    auto fetch = [grpc, &clock](uint32_t s) -> absl::StatusOr<RdmaServerInfo> {
      grpc::ClientContext context;
      SetDeadline(context, clock.Now() + absl::Seconds(5));
      hlem::v1::RdmaInfo info;
      absl::Status status = FromGrpcStatus(
          grpc->stub(s).GetRdmaInfo(&context, hlem::v1::GetRdmaInfoRequest(), &info));
      if (!status.ok()) return status;
      RdmaServerInfo out;
      out.worker_address = info.worker_address();
      out.host_id = info.host_id();
      out.transports.assign(info.transports().begin(), info.transports().end());
      for (const auto& r : info.regions()) {
        out.regions.push_back(RdmaRegionInfo{r.table_id(), r.partition(), r.base_address(),
                                             r.rkey(), r.stride_bytes(), r.first_slot(),
                                             r.num_slots()});
      }
      return out;
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
