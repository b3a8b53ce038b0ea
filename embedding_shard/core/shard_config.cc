#include "embedding_shard/core/shard_config.h"

#include <yaml-cpp/yaml.h>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/status_macros.h"

namespace hlem::shard {

absl::StatusOr<ShardClusterConfig> ParseShardClusterConfig(const YAML::Node& root) {
  ShardClusterConfig config;
  ConfigReader reader(root, "");
  reader.Map(
      "shard_map",
      [&](ConfigReader& r) {
        uint64_t num_shards = config.map.num_shards, replicas = config.map.replicas;
        std::string partitioning = "range";
        r.UInt("num_shards", &num_shards, 1, 4096, true)
            .Enum("partitioning", &partitioning, {"range", "hash"})
            .UInt("replicas", &replicas, 1, 4096)
            .UInt("hash_seed", &config.map.hash_seed, 0, UINT64_MAX);
        if (replicas > num_shards) {
          r.AddError("replicas",
                     absl::StrCat("must be in [1, ", num_shards, "] (num_shards), got ", replicas));
        }
        config.map.num_shards = static_cast<uint32_t>(num_shards);
        config.map.replicas = static_cast<uint32_t>(replicas);
        config.map.partitioning =
            partitioning == "hash" ? Partitioning::kHash : Partitioning::kRange;
      },
      true);
  absl::flat_hash_set<uint32_t> ids;
  reader.List(
      "tables",
      [&](ConfigReader& r, size_t index) {
        TableSpec spec;
        uint64_t id = index, dim = 0;
        std::string dtype = "fp32";
        r.UInt("id", &id, 0, UINT32_MAX, true)
            .String("name", &spec.name, true)
            .UInt("rows", &spec.rows, 1, kMaxTableRows, true)
            .UInt("dim", &dim, 1, kMaxTableDim, true)
            .Enum("dtype", &dtype, {"fp32", "fp16", "bf16"});
        spec.id = static_cast<uint32_t>(id);
        spec.dim = static_cast<uint32_t>(dim);
        spec.dtype = ParseDtype(dtype).value_or(Dtype::kFp32);
        if (!ids.insert(spec.id).second) {
          r.AddError("id", absl::StrCat("duplicate table id ", spec.id));
        }
        if (spec.name.empty() || spec.name.size() > 255 ||
            spec.name.find('/') != std::string::npos) {
          r.AddError("name", "must be 1..255 characters without '/'");
        }
        config.tables.push_back(std::move(spec));
      },
      true);
  if (reader.Has("tables") && config.tables.empty()) {
    reader.AddError("tables", "at least one table is required");
  }
  reader.Map("content", [&](ConfigReader& r) {
    std::string source = "generated";
    r.Enum("source", &source, {"generated", "file"})
        .UInt("seed", &config.content.seed, 0, UINT64_MAX)
        .String("dir", &config.content.dir);
    config.content.kind =
        source == "file" ? ContentSource::Kind::kFile : ContentSource::Kind::kGenerated;
    if (config.content.kind == ContentSource::Kind::kFile && config.content.dir.empty()) {
      r.AddError("dir", "required when source is 'file'");
    }
  });
  reader.Map("limits", [&](ConfigReader& r) {
    uint64_t max_batch_rows = config.max_batch_rows;
    r.UInt("max_batch_rows", &max_batch_rows, 1, 1 << 24);
    config.max_batch_rows = static_cast<uint32_t>(max_batch_rows);
  });
  // A full batch of the widest table must fit one Lookup reply, or every such call would be read
  // and gathered only to fail at send time.
  for (const TableSpec& t : config.tables) {
    const uint64_t bytes = uint64_t{config.max_batch_rows} * t.row_bytes();
    if (bytes + (1 << 10) > kMaxLookupReplyBytes) {
      reader.AddError("limits.max_batch_rows",
                      absl::StrCat(config.max_batch_rows, " rows of table '", t.name, "' (",
                                   t.row_bytes(), " bytes each) exceed the ",
                                   kMaxLookupReplyBytes >> 20, " MiB a Lookup reply may hold"));
      break;
    }
  }
  reader.StringList("servers", &config.servers);
  reader.Map("ucx", [&](ConfigReader& r) {
    uint64_t shm = config.ucx.gather_min_rows_shm, tcp = config.ucx.gather_min_rows_tcp;
    r.Bool("enabled", &config.ucx.enabled)
        .String("transports", &config.ucx.transports)
        .String("net_devices", &config.ucx.net_devices)
        .UInt("gather_min_rows_shm", &shm, 1, 1 << 24)
        .UInt("gather_min_rows_tcp", &tcp, 1, 1 << 24)
        .Enum("error_handling", &config.ucx.error_handling, {"auto", "peer", "none"})
        .Duration("progress_spin", &config.ucx.progress_spin, absl::ZeroDuration(),
                  absl::Seconds(1));
    config.ucx.gather_min_rows_shm = static_cast<uint32_t>(shm);
    config.ucx.gather_min_rows_tcp = static_cast<uint32_t>(tcp);
  });
  if (!config.servers.empty() && config.servers.size() != config.map.num_shards) {
    reader.AddError("servers",
                    absl::StrCat("has ", config.servers.size(),
                                 " addresses, shard_map.num_shards is ", config.map.num_shards));
  }
  RETURN_IF_ERROR(reader.Finish());
  return config;
}

absl::StatusOr<ShardClusterConfig> LoadShardClusterConfig(const std::string& path) {
  ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  auto config = ParseShardClusterConfig(root);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

ShardStoreOptions StoreOptionsFor(const ShardClusterConfig& config, uint32_t shard_index) {
  ShardStoreOptions options;
  options.tables = config.tables;
  options.map = config.map;
  options.server_index = shard_index;
  options.content = config.content;
  options.max_batch_rows = config.max_batch_rows;
  return options;
}

ShardClientOptions ClientOptionsFor(const ShardClusterConfig& config) {
  ShardClientOptions options;
  options.tables = config.tables;
  options.map = config.map;
  options.max_batch_rows = config.max_batch_rows;
  return options;
}

}  // namespace hlem::shard
