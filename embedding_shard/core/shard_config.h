#pragma once
// The embedding-shard cluster config: one YAML file read by every shard server (with its own
// --shard-index) and by every client, so both sides agree on tables and the shard map.
// Example and every field's default: deploy/local/shards.yaml and docs/embedding_shard.md.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "embedding_shard/core/shard_client.h"
#include "embedding_shard/core/shard_store.h"

namespace YAML {
class Node;
}

namespace hlem::shard {

// UCX data-plane settings (plain data; the UCX code lives in embedding_shard/transport).
struct UcxOptions {
  bool enabled = true;
  // "auto" (whatever UCX finds), "shm" (shared memory only), "tcp", or a raw UCX_TLS list.
  std::string transports = "auto";
  std::string net_devices = "lo";  // UCX_NET_DEVICES; "" = all
  // A batch to one server of at least this many rows is read by the server-side gather
  // (one active-message reply) instead of one one-sided get per row. Measured per transport:
  // docs/perf/embedding_shard.md.
  uint32_t gather_min_rows_shm = 1 << 24;  // measured: get beat gather at every batch size
  uint32_t gather_min_rows_tcp = 1;
  absl::Duration progress_spin = absl::Microseconds(200);  // busy-poll after activity
  // Peer-failure handling on client endpoints: "peer", "none", or "auto" = none for a server on
  // the same host (UCX 1.13 offers shared memory only without it), peer for a remote one.
  std::string error_handling = "auto";
};

// The largest Lookup reply a shard sends (its gRPC send limit; clients receive as much).
inline constexpr int kMaxLookupReplyBytes = 256 << 20;

struct ShardClusterConfig {
  std::vector<TableSpec> tables;
  ShardMapOptions map;
  ContentSource content;
  uint32_t max_batch_rows = 65536;
  std::vector<std::string> servers;  // gRPC address per shard index (clients); may be empty
  UcxOptions ucx;
};

absl::StatusOr<ShardClusterConfig> ParseShardClusterConfig(const YAML::Node& root);
absl::StatusOr<ShardClusterConfig> LoadShardClusterConfig(const std::string& path);

ShardStoreOptions StoreOptionsFor(const ShardClusterConfig& config, uint32_t shard_index);
ShardClientOptions ClientOptionsFor(const ShardClusterConfig& config);

}  // namespace hlem::shard
