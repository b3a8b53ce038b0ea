// Fuzz target: node config YAML (ParseNodeConfig), next to a valid shard cluster config. Every
// input must parse or fail with INVALID_ARGUMENT naming a field; never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/config.h"
#include "serving_node/service/node_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto root = hlem::ParseYaml(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!root.ok()) return 0;
  auto config = hlem::serving::ParseNodeConfig(*root, HLEM_NODE_CONFIG_TESTDATA);
  if (!config.ok() && config.status().code() != absl::StatusCode::kInvalidArgument) {
    __builtin_trap();
  }
  return 0;
}
