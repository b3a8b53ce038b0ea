#pragma once
// The twin's options from the files a user names (`hlem sim`, `hlem train-ppo`): the nodes'
// config, the cost model, the routing policy. Errors name the flag.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sim/twin/twin.h"

namespace hlem::tools {

struct TwinFiles {
  std::string node_config = "deploy/local/node.yaml";
  std::string costs = "sim/costs/cpu-local-cluster.yaml";
  std::string router = "hlem";
  uint32_t nodes = 4, emb_sample = 1;
  bool history_sketch = false;  // first visits' histories sketched (needs emb_sample >= 2)
};

struct TwinSetup {
  sim::TwinOptions twin;
  absl::Duration slo;     // the node config's
  absl::Duration window;  // the nodes' decision window
};

absl::StatusOr<TwinSetup> LoadTwinSetup(const TwinFiles& files);

}  // namespace hlem::tools
