// Fuzz target: the shard cluster config parser (YAML from operators).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/config.h"
#include "embedding_shard/core/shard_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto node = hlem::ParseYaml(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!node.ok()) return 0;
  auto config = hlem::shard::ParseShardClusterConfig(*node);
  if (config.ok() && (config->tables.empty() || config->map.replicas > config->map.num_shards)) {
    __builtin_trap();  // the parser accepted something it promises to reject
  }
  return 0;
}
