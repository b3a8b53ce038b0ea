#include "tools/twin_setup.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "embedding_shard/core/shard_config.h"
#include "router/core/policy.h"
#include "serving_node/service/node_config.h"
#include "sim/twin/cost_model.h"

namespace hlem::tools {

absl::StatusOr<TwinSetup> LoadTwinSetup(const TwinFiles& f) {
  auto config = serving::LoadNodeConfig(f.node_config);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--node-config: ", config.status().message()));
  }
  auto local = serving::ResolveLocalNodeOptions(*config);
  if (!local.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--node-config: ", local.status().message()));
  }
  auto costs = sim::LoadCostModel(f.costs);
  if (!costs.ok()) {
    return absl::Status(costs.status().code(), absl::StrCat("--costs: ", costs.status().message()));
  }
  auto policy = router::ParsePolicy(f.router);
  if (!policy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--router: ", policy.status().message()));
  }
  if (f.history_sketch && f.emb_sample < 2) {
    return absl::InvalidArgumentError(
        "--history-sketch: needs --emb-sample 2 or more (a sketch draws the sampled rows only)");
  }
  TwinSetup s;
  s.twin.node = {.local = *local,
                 .model = config->model,
                 .kv_dtype_bytes = costs->kv_dtype_bytes,
                 .emb_sample = f.emb_sample};
  s.twin.nodes = f.nodes;
  s.twin.costs = *costs;
  s.twin.router.policy = *policy;
  s.twin.history_sketch = f.history_sketch;
  // For shard faults: the shards' map and tables, the nodes' client timings; a dead server
  // refuses gRPC connections, over UCX shared memory it is silent (sim/twin/sim_shards.h).
  s.twin.shards = sim::SimShardOptions{.client = shard::ClientOptionsFor(config->shards),
                                       .dead_refuses = config->shard_transport == "grpc"};
  s.slo = config->node.slo;
  s.window = local->node.window;
  return s;
}

}  // namespace hlem::tools
