#include "serving_node/service/node_config.h"

#include <filesystem>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/status_macros.h"

namespace hlem::serving {
namespace {

// ConfigReader reads 64-bit integers; most fields here are 32-bit.
void U32(ConfigReader& r, std::string_view key, uint32_t* out, uint32_t min, uint32_t max) {
  uint64_t v = *out;
  r.UInt(key, &v, min, max);
  *out = static_cast<uint32_t>(v);
}

}  // namespace

absl::StatusOr<NodeConfig> ParseNodeConfig(const YAML::Node& root, const std::string& base_dir) {
  NodeConfig c;
  ConfigReader reader(root, "");
  reader.Map("node", [&](ConfigReader& r) {
    NodeOptions& n = c.node;
    r.String("id", &n.node_id)
        .Duration("slo", &n.slo, absl::Microseconds(1), absl::Seconds(60))
        .Duration("window", &n.window, absl::Milliseconds(1), absl::Hours(1))
        .Double("p99_norm_cap", &n.p99_norm_cap, 1e-3, 1e6)
        .UInt("max_in_flight_tokens", &n.max_in_flight_tokens, 1, 1ull << 40)
        .Duration("load_report_interval", &n.load_report_interval, absl::Milliseconds(1),
                  absl::Minutes(10))
        .Double("load_report_change", &n.load_report_change, 0, 1)
        .UInt("events_retained", &c.events_retained, 1, 1ull << 30)
        .UInt("seed", &n.seed, 0, UINT64_MAX);
    U32(r, "hot_windows", &n.hot_windows, 1, 1 << 20);
    U32(r, "keep_windows", &n.keep_windows, 1, 1 << 20);
    U32(r, "latency_samples", &n.latency_samples, 1, 1 << 24);
    U32(r, "compute_threads", &c.compute_threads, 1, 1024);
    if (n.node_id.empty()) r.AddError("id", "must not be empty");
  });
  reader.Map("memory", [&](ConfigReader& r) {
    std::string policy = c.emb_policy == EmbPolicy::kLru ? "lru" : "tinylfu";
    r.Enum("device", &c.device, {"cpu", "cuda"})
        .Bytes("pool_bytes", &c.pool_bytes, 1 << 12, 1ull << 40)
        .Bytes("page_bytes", &c.page_bytes, 1 << 10, 1ull << 30)
        .Double("initial_alpha", &c.memory.initial_alpha, 0, 1)
        .Enum("emb_policy", &policy, {"lru", "tinylfu"})
        .UInt("residency_shard_rows", &c.residency_shard_rows, 1, 1ull << 40)
        .Double("residency_threshold", &c.residency_threshold, 1e-9, 1)
        .Duration("step_interval", &c.memory.step_interval, absl::Microseconds(100),
                  absl::Seconds(10))
        .Map("link", [&](ConfigReader& l) {
          l.Double("bytes_per_second", &c.link.bytes_per_second, 1e3, 1e13)
              .Duration("latency", &c.link.latency, absl::ZeroDuration(), absl::Seconds(1));
        });
    U32(r, "reclaim_pages_per_step", &c.memory.reclaim_pages_per_step, 1, 1 << 30);
    U32(r, "cuda_device", &c.cuda_device, 0, 1023);
    c.emb_policy = policy == "lru" ? EmbPolicy::kLru : EmbPolicy::kTinyLfu;
    if (c.page_bytes > c.pool_bytes / 2) {
      r.AddError(
          "page_bytes",
          absl::StrCat(c.page_bytes, " leaves fewer than 2 pages in pool_bytes ", c.pool_bytes));
    }
  });
  reader.Map("refill", [&](ConfigReader& r) {
    r.Bool("enabled", &c.refill_enabled)
        .Double("bytes_per_second", &c.refill.bytes_per_second, 1, 1e13)
        .Bytes("chunk_bytes", &c.refill.chunk_bytes, 1, 1ull << 30)
        .Bytes("burst_bytes", &c.refill.burst_bytes, 1, 1ull << 32);
    U32(r, "popularity_capacity", &c.popularity_capacity, 16, 1 << 26);
    // One refill copy holds the link against a miss for its whole length: copy_bytes splits a
    // chunk's copies finer than its fetch (docs/calibration.md). Default: the chunk.
    uint64_t copy_bytes = 0;
    r.Bytes("copy_bytes", &copy_bytes, 1, 1ull << 30);
    c.refill.max_copy_bytes = copy_bytes > 0 ? copy_bytes : c.refill.chunk_bytes;
    if (copy_bytes > c.refill.chunk_bytes) {
      r.AddError("copy_bytes", "must not exceed chunk_bytes");
    }
    if (c.refill.burst_bytes < c.refill.chunk_bytes) {
      r.AddError("burst_bytes", "must hold one chunk (>= chunk_bytes)");
    }
  });
  reader.Map("queue", [&](ConfigReader& r) {
    int64_t workers = c.queue.workers;
    U32(r, "max_batch", &c.queue.max_batch, 1, 4096);
    U32(r, "max_queue", &c.queue.max_queue, 1, 1 << 24);
    r.Duration("max_delay", &c.queue.max_delay, absl::Microseconds(1), absl::Hours(1));
    r.Duration("batch_window", &c.queue.batch_window, absl::ZeroDuration(), absl::Seconds(1))
        .Bool("adaptive_window", &c.queue.adaptive_window)
        .Int("workers", &workers, 1, 256);
    c.queue.workers = static_cast<int>(workers);
  });
  reader.Map(
      "model",
      [&](ConfigReader& r) {
        HstuConfig& m = c.model;
        double attn_norm = m.attn_norm;
        r.String("weights", &c.weights)
            .UInt("seed", &c.model_seed, 0, UINT64_MAX)
            .String("name", &c.model_name)
            .Double("attn_norm", &attn_norm, 1e-6, 1e9)
            .StringList("features", &c.features, true)
            .Double("trim_fraction", &c.trim_fraction, 1e-6, 1)
            .Enum("cuda_attention", &c.cuda_attention, {"bf16", "fp32"})
            .Enum("cuda_gemm", &c.cuda_gemm, {"fp32", "tf32"});
        U32(r, "layers", &m.layers, 1, 256);
        U32(r, "dim", &m.dim, 1, 1 << 16);
        U32(r, "heads", &m.heads, 1, 1024);
        U32(r, "d_qk", &m.d_qk, 1, 1 << 16);
        U32(r, "d_v", &m.d_v, 1, 1 << 16);
        U32(r, "head_hidden", &m.head_hidden, 1, 1 << 16);
        U32(r, "targets", &m.targets, 1, 1 << 16);
        U32(r, "max_positions", &m.max_positions, 2, 1 << 24);
        U32(r, "max_history", &c.max_history, 1, 1 << 24);
        U32(r, "max_candidates", &c.max_candidates, 1, 1 << 20);
        U32(r, "max_request_events", &c.max_request_events, 1, 1 << 24);
        m.attn_norm = static_cast<float>(attn_norm);
        if (c.max_history >= m.max_positions) {
          r.AddError("max_history",
                     absl::StrCat(c.max_history, " must be < max_positions ", m.max_positions));
        }
        if (c.max_request_events < c.max_history) {
          r.AddError("max_request_events", "must be >= max_history");
        }
        if (r.Has("features") && c.features.empty()) r.AddError("features", "none");
        if (c.model_name.empty()) {
          c.model_name = c.weights.empty() ? absl::StrCat("hstu-random-", c.model_seed)
                                           : std::filesystem::path(c.weights).filename().string();
        }
      },
      true);
  reader.Map(
      "shards",
      [&](ConfigReader& r) {
        r.String("config", &c.shards_config, true)
            .Enum("transport", &c.shard_transport, {"grpc", "ucx"})
            .StringList("servers", &c.shard_servers);
      },
      true);
  RETURN_IF_ERROR(reader.Finish());

  // The shard cluster: its tables define the features.
  std::filesystem::path shards_path(c.shards_config);
  if (shards_path.is_relative()) shards_path = std::filesystem::path(base_dir) / shards_path;
  c.shards_config = shards_path.string();
  if (!c.weights.empty() && std::filesystem::path(c.weights).is_relative()) {
    c.weights = (std::filesystem::path(base_dir) / c.weights).string();
  }
  absl::StatusOr<shard::ShardClusterConfig> shards = shard::LoadShardClusterConfig(c.shards_config);
  if (!shards.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: shards.config: ", shards.status().message()));
  }
  c.shards = std::move(*shards);
  if (!c.shard_servers.empty() && c.shard_servers.size() != c.shards.map.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: shards.servers: ", c.shard_servers.size(), " addresses for ",
                     c.shards.map.num_shards, " shards"));
  }
  for (size_t f = 0; f < c.features.size(); ++f) {
    const shard::TableSpec* table = nullptr;
    for (const shard::TableSpec& t : c.shards.tables) {
      if (t.name == c.features[f]) table = &t;
    }
    if (table == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("config: model.features[", f, "]: no table '",
                                                     c.features[f], "' in ", c.shards_config));
    }
    if (table->dim != c.model.dim || table->dtype != shard::Dtype::kFp32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config: model.features[", f, "]: table '", table->name, "' has dim ", table->dim, " ",
          shard::DtypeName(table->dtype), "; the model needs dim ", c.model.dim, " fp32"));
    }
  }
  RETURN_IF_ERROR(c.model.Validate());
  return c;
}

absl::StatusOr<NodeConfig> LoadNodeConfig(const std::string& path) {
  ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(path));
  absl::StatusOr<NodeConfig> config =
      ParseNodeConfig(root, std::filesystem::path(path).parent_path().string());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<LocalNodeOptions> ResolveLocalNodeOptions(const NodeConfig& config) {
  LocalNodeOptions options = config;
  options.pipeline = {.max_candidates = config.max_candidates,
                      .max_history = config.max_history,
                      .trim_fraction = config.trim_fraction,
                      .max_request_events = config.max_request_events};
  options.tables.clear();
  absl::flat_hash_set<uint32_t> tables;
  for (const std::string& name : config.features) {
    for (const shard::TableSpec& t : config.shards.tables) {
      if (t.name != name) continue;
      options.pipeline.features.push_back({.table_id = t.id, .rows = t.rows});
      if (tables.insert(t.id).second) {
        options.tables.push_back({t.id, static_cast<uint32_t>(t.row_bytes())});
      }
    }
  }
  if (options.pipeline.features.size() != config.features.size()) {
    return absl::InvalidArgumentError("model.features: a table is not in the shard config");
  }
  return options;
}

}  // namespace hlem::serving
