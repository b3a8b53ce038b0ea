#include "serving_node/service/node_stack.h"

#include <dlfcn.h>
#include <malloc.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "torch/torch.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<NodeStack>> NodeStack::Build(const NodeConfig& config,
                                                            RowSource& source, uint64_t epoch,
                                                            Clock& clock) {
  auto s = std::make_unique<NodeStack>();
  s->config = config;
  EmbCacheOptions emb_options{.residency_shard_rows = config.residency_shard_rows,
                              .policy = config.emb_policy};
  absl::flat_hash_set<uint32_t> tables;
  for (const std::string& name : config.features) {
    for (const shard::TableSpec& t : config.shards.tables) {
      if (t.name != name) continue;
      s->features.push_back({.table_id = t.id, .rows = t.rows});
      if (tables.insert(t.id).second) {
        emb_options.tables.push_back({t.id, static_cast<uint32_t>(t.row_bytes())});
      }
    }
  }
  if (s->features.size() != config.features.size()) {
    return absl::InvalidArgumentError("model.features: a table is not in the shard config");
  }
  ASSIGN_OR_RETURN(
      s->pool, HbmPool::Create({.pool_bytes = config.pool_bytes, .page_bytes = config.page_bytes}));
  ASSIGN_OR_RETURN(
      s->device, CpuDevice::Create({.pool_bytes = config.pool_bytes, .link = config.link}, clock));
  s->events = std::make_unique<ResidencyEventLog>(epoch, config.events_retained);
  s->residency = FollowResidency(*s->events);
  ASSIGN_OR_RETURN(
      s->kv, KvCache::Create(
                 {.layers = config.model.layers, .kv_dim = config.model.kv_dim(), .dtype_bytes = 4},
                 *s->pool, s->events.get(), clock));
  ASSIGN_OR_RETURN(s->emb, EmbCache::Create(emb_options, *s->pool, clock));
  ASSIGN_OR_RETURN(s->memory,
                   MemoryManager::Create(config.memory, *s->pool, *s->kv, *s->emb, clock));
  ASSIGN_OR_RETURN(s->sketch, PopularitySketch::Create({.capacity = config.popularity_capacity}));
  if (config.refill_enabled) {
    ASSIGN_OR_RETURN(s->refiller, Refiller::Create(config.refill, *s->emb, *s->device, source,
                                                   *s->sketch, clock));
  }
  ASSIGN_OR_RETURN(s->tracker,
                   ResidencyTracker::Create({.residency_shard_rows = config.residency_shard_rows,
                                             .windows = config.node.hot_windows,
                                             .threshold = config.residency_threshold},
                                            *s->emb, s->events.get()));
  if (config.weights.empty()) {
    ASSIGN_OR_RETURN(s->model, HstuModel::CreateRandom(config.model, config.model_seed));
  } else {
    ASSIGN_OR_RETURN(s->model, HstuModel::Load(config.model, config.weights));
  }
  PipelineOptions pipeline_options{.features = s->features,
                                   .max_candidates = config.max_candidates,
                                   .max_history = config.max_history,
                                   .trim_fraction = config.trim_fraction,
                                   .max_request_events = config.max_request_events};
  ResidencyTracker* tracker = s->tracker.get();
  pipeline_options.on_lookup = [tracker](uint32_t table, std::span<const uint64_t> rows) {
    tracker->Record(table, rows);
  };
  ASSIGN_OR_RETURN(s->pipeline, Pipeline::Create(pipeline_options, *s->kv, *s->emb, *s->device,
                                                 s->device->pool_data(), source, *s->model,
                                                 s->sketch.get(), clock));
  ASSIGN_OR_RETURN(s->queue, RequestQueue::Create(config.queue, *s->pipeline, clock));
  ASSIGN_OR_RETURN(s->node, Node::Create(config.node,
                                         {.pipeline = s->pipeline.get(),
                                          .queue = s->queue.get(),
                                          .memory = s->memory.get(),
                                          .kv = s->kv.get(),
                                          .emb = s->emb.get(),
                                          .device = s->device.get(),
                                          .events = s->events.get(),
                                          .residency = s->residency.get(),
                                          .refiller = s->refiller.get(),
                                          .tracker = s->tracker.get(),
                                          .row_bytes = config.model.dim * 4,
                                          .link_bytes_per_second = config.link.bytes_per_second,
                                          .max_queue = config.queue.max_queue},
                                         clock));
  return s;
}

void NodeStack::Start() {
  memory->Start();
  node->Start();
}

NodeStack::~NodeStack() {
  if (node != nullptr) node->Stop();
  if (queue != nullptr) queue->Drain();
  if (memory != nullptr) memory->Stop();
  if (refiller != nullptr) refiller->Cancel();
}

std::string TuneComputeProcess(char** argv) {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  using CoreName = char* (*)();
  const auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (corename == nullptr) return "openblas not loaded";
  const std::string core = corename();
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced != nullptr) {
    return absl::StrCat("openblas core ", core, " (OPENBLAS_CORETYPE=", forced, ")");
  }
  if (strcasecmp(core.c_str(), "prescott") != 0) return absl::StrCat("openblas core ", core);
  __builtin_cpu_init();
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    better = "Haswell";
  }
  if (better == nullptr || argv == nullptr) return absl::StrCat("openblas core ", core);
  setenv("OPENBLAS_CORETYPE", better, /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  // exec failed: carry on with the generic kernels.
  return absl::StrCat("openblas core ", core, " (re-exec with ", better, " failed)");
}

void SetComputeThreads(uint32_t threads) {
  const std::string n = std::to_string(threads);
  setenv("OMP_NUM_THREADS", n.c_str(), /*overwrite=*/0);
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
  at::set_num_threads(static_cast<int>(threads));
  try {
    at::set_num_interop_threads(1);
  } catch (const std::exception&) {
    // Only possible before the first inter-op work; later calls keep what is set.
  }
}

}  // namespace hlem::serving
