#pragma once
// The serving node's YAML config (one file per node; example with every field: deploy/local/
// node.yaml, reference: docs/node.md). It names the embedding-shard cluster config it reads rows
// from, so the node and the shards agree on tables. Every error names the field.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "embedding_shard/core/shard_config.h"
#include "serving_node/device/local_node.h"
#include "serving_node/model/hstu_config.h"

namespace YAML {
class Node;
}

namespace hlem::serving {

// The node's parts (pool, link, memory, caches, refill, queue, residency; LocalNodeOptions) plus
// the device, the model and the embedding shards. `pipeline` is filled from the model fields by
// NodeStack::Build.
struct NodeConfig : LocalNodeOptions {
  std::string device = "cpu";    // cpu | cuda (the CUDA model runner and a cudaMalloc'd pool)
  uint32_t cuda_device = 0;      // CUDA ordinal for device: cuda
  uint32_t compute_threads = 1;  // torch intra-op threads (and OMP_NUM_THREADS)

  // Model.
  HstuConfig model;
  std::string weights;  // torch.save state dict; "" = random from model_seed
  uint64_t model_seed = 1;
  std::string model_name;
  std::vector<std::string> features;  // shard table names, in feature order
  uint32_t max_history = 1024;
  uint32_t max_candidates = 512;
  uint32_t max_request_events = 1 << 16;  // events in one request; more is INVALID_ARGUMENT
  double trim_fraction = 0.1;
  // memory.device: cuda: the attention kernel's arithmetic (docs/node.md): bf16 tensor cores
  // (fp32 accumulation; heads of 64 or 128) or fp32 throughout.
  std::string cuda_attention = "bf16";
  // memory.device: cuda: the projections' GEMMs: tf32 tensor cores or fp32 (cuBLAS SGEMM).
  std::string cuda_gemm = "tf32";

  // Embedding shards.
  std::string shards_config;  // path; relative to the node config's directory
  shard::ShardClusterConfig shards;
  std::string shard_transport = "grpc";    // grpc | ucx
  std::vector<std::string> shard_servers;  // overrides the cluster config's servers
};

// INVALID_ARGUMENT "config: <field>: <problem>; ..." listing every problem. `base_dir` resolves a
// relative shards.config path; the shard cluster config is loaded too.
absl::StatusOr<NodeConfig> ParseNodeConfig(const YAML::Node& root, const std::string& base_dir);
absl::StatusOr<NodeConfig> LoadNodeConfig(const std::string& path);

// The node's parts as the config describes them: the pipeline's features (the shard tables named
// by model.features, in order), limits, and the tables' row sizes. INVALID_ARGUMENT when a
// feature names no table of the shard config. NodeStack::Build and `hlem sim` use it.
absl::StatusOr<LocalNodeOptions> ResolveLocalNodeOptions(const NodeConfig& config);

}  // namespace hlem::serving
