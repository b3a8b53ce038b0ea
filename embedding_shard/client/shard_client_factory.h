#pragma once
// Builds a ready ShardClient for a shard cluster: checks that every reachable server agrees with
// the cluster config (shard map, tables), then wires the chosen transport. With UCX, endpoints
// and remote keys are set up here, before the first request.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/grpc_security.h"
#include "common/metrics.h"
#include "embedding_shard/client/grpc_transport.h"
#include "embedding_shard/core/shard_client.h"
#include "embedding_shard/core/shard_config.h"
#include "embedding_shard/transport/ucx_client.h"

namespace hlem::shard {

enum class ClientTransport { kUcx, kGrpc };
absl::StatusOr<ClientTransport> ParseClientTransport(absl::string_view name);

struct ShardClientSetup {
  ShardClusterConfig cluster;
  std::vector<std::string> addresses;  // gRPC address per shard index (default: cluster.servers)
  ClientTransport transport = ClientTransport::kUcx;
  UcxReadMode ucx_mode = UcxReadMode::kAuto;
  absl::Duration connect_timeout = absl::Seconds(10);
  // Once the servers that answered hold every partition, how long the others still get.
  absl::Duration straggler_grace = absl::Seconds(1);
  absl::Duration probe_interval = absl::Milliseconds(500);
  MetricsRegistry* metrics = nullptr;  // optional: export hlem_shard_client_* here
  TlsConfig tls;                       // the gRPC channels' (UCX reads are not covered)
};

// Server `server`'s UCX worker address and memory regions (EmbeddingShard.GetRdmaInfo), within
// `deadline`: what UcxShardTransport connects with.
absl::StatusOr<RdmaServerInfo> FetchRdmaServerInfo(GrpcShardTransport& grpc, uint32_t server,
                                                   absl::Time deadline);

// FAILED_PRECONDITION when a server's shard map or tables differ from the config; a server that
// does not answer is tolerated (it is marked down and probed) as long as one answers. The
// client's health probes and reconnects run as timers of `clock` and wait on the shards (up to
// probe_timeout, or a reconnect's warm-up): give it a clock whose timer thread nothing
// latency-critical shares.
absl::StatusOr<std::unique_ptr<ShardClient>> ConnectShardClient(const ShardClientSetup& setup,
                                                                Clock& clock);

}  // namespace hlem::shard
