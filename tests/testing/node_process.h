#pragma once
// Tests only: a `serving_node` process on loopback (OS-chosen ports) with stubs for both of its
// services. The binary path comes from the caller (HLEM_NODE_BINARY in CMake).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/process.h"
#include "hlem/v1/serving_node.grpc.pb.h"
#include "tests/testing/shard_cluster.h"

namespace hlem::testing {

struct NodeProcess {
  ChildProcess process;
  int port = 0, admin_port = 0, metrics_port = 0;
  std::unique_ptr<hlem::v1::ServingNode::Stub> stub;
  std::unique_ptr<hlem::v1::ServingNodeAdmin::Stub> admin;
  std::string address() const;  // "127.0.0.1:<port>"
};

// Starts `binary --config <config> --node-id <name>` with the shard addresses, serving on
// `listen`; logs and the ports file go to dir/<name>.{log,ports}. Waits until it serves.
absl::StatusOr<NodeProcess> StartNode(const std::string& binary, const std::string& dir,
                                      const std::string& config, const std::string& name,
                                      const std::vector<std::string>& shard_servers,
                                      const std::string& listen = "127.0.0.1:0");

// A loopback TCP port that was free a moment ago (bound to port 0, then closed).
int UnusedPort();

// The body of GET /metrics on 127.0.0.1:port (empty when it cannot connect).
std::string ScrapeMetrics(int port);

// One shard on loopback with two fp32 tables of dim 32 (item: 100 000 rows, category: 500), the
// cluster the node and router integration tests run against.
inline constexpr char kTestShardsYaml[] = R"(
shard_map: {num_shards: 1, partitioning: hash, replicas: 1, hash_seed: 3}
tables:
  - {id: 0, name: item, rows: 100000, dim: 32, dtype: fp32}
  - {id: 1, name: category, rows: 500, dim: 32, dtype: fp32}
content: {source: generated, seed: 11}
limits: {max_batch_rows: 4096}
ucx: {transports: auto, net_devices: lo}
)";

// A shard cluster from `shards_yaml` running in `dir` (its config is dir/shards.yaml) and
// `node_yaml` written to dir/node.yaml next to it, ready for StartNode.
absl::StatusOr<std::unique_ptr<ShardCluster>> StartShardsForNodes(const std::string& shard_binary,
                                                                  const std::string& dir,
                                                                  const std::string& shards_yaml,
                                                                  const std::string& node_yaml);

}  // namespace hlem::testing
