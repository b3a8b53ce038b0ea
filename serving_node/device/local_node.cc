#include "serving_node/device/local_node.h"

#include <span>

#include "absl/container/flat_hash_set.h"
#include "common/status_macros.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<LocalNode>> LocalNode::Build(const LocalNodeOptions& options,
                                                            RowSource& source, ModelRunner& runner,
                                                            uint64_t epoch, Clock& clock) {
  auto node = std::make_unique<LocalNode>();
  RETURN_IF_ERROR(node->Assemble(options, source, runner, epoch, clock));
  return node;
}

EmbCacheOptions EmbCacheOptionsFor(const LocalNodeOptions& options, uint32_t row_bytes) {
  EmbCacheOptions emb{.residency_shard_rows = options.residency_shard_rows,
                      .policy = options.emb_policy};
  emb.tables = options.tables;
  absl::flat_hash_set<uint32_t> tables;
  for (const EmbTableSpec& t : options.tables) tables.insert(t.table_id);
  for (const FeatureSpec& f : options.pipeline.features) {
    if (tables.insert(f.table_id).second) emb.tables.push_back({f.table_id, row_bytes});
  }
  return emb;
}

absl::Status LocalNode::Assemble(const LocalNodeOptions& options, RowSource& source,
                                 ModelRunner& runner, uint64_t epoch, Clock& clock) {
  const EmbCacheOptions emb_options = EmbCacheOptionsFor(options, runner.dim() * 4);
  ASSIGN_OR_RETURN(
      pool, HbmPool::Create({.pool_bytes = options.pool_bytes, .page_bytes = options.page_bytes}));
  std::byte* runner_pool = nullptr;
  if (options.make_device) {
    ASSIGN_OR_RETURN(PoolDevice made, options.make_device(options.pool_bytes));
    if (made.device == nullptr || made.runner_pool == nullptr) {
      return absl::InternalError("make_device returned no device or no pool address");
    }
    device = std::move(made.device);
    runner_pool = made.runner_pool;
  } else {
    ASSIGN_OR_RETURN(
        std::unique_ptr<CpuDevice> cpu,
        CpuDevice::Create({.pool_bytes = options.pool_bytes, .link = options.link}, clock));
    runner_pool = cpu->pool_data();
    device = std::move(cpu);
  }
  events = std::make_unique<ResidencyEventLog>(epoch, options.events_retained);
  residency = FollowResidency(*events);
  ASSIGN_OR_RETURN(
      kv, KvCache::Create({.layers = runner.layers(), .kv_dim = runner.kv_dim(), .dtype_bytes = 4},
                          *pool, events.get(), clock));
  ASSIGN_OR_RETURN(emb, EmbCache::Create(emb_options, *pool, clock));
  Clock& background = options.background_clock != nullptr ? *options.background_clock : clock;
  ASSIGN_OR_RETURN(memory, MemoryManager::Create(options.memory, *pool, *kv, *emb, background));
  ASSIGN_OR_RETURN(sketch, PopularitySketch::Create({.capacity = options.popularity_capacity}));
  if (options.refill_enabled) {
    ASSIGN_OR_RETURN(refiller,
                     Refiller::Create(options.refill, *emb, *device, source, *sketch, background));
  }
  ASSIGN_OR_RETURN(tracker,
                   ResidencyTracker::Create({.residency_shard_rows = options.residency_shard_rows,
                                             .windows = options.node.hot_windows,
                                             .threshold = options.residency_threshold},
                                            *emb, events.get()));
  PipelineOptions pipeline_options = options.pipeline;
  ResidencyTracker* t = tracker.get();
  pipeline_options.on_lookup = [t](uint32_t table, std::span<const uint64_t> rows) {
    t->Record(table, rows);
  };
  ASSIGN_OR_RETURN(pipeline, Pipeline::Create(pipeline_options, *kv, *emb, *device, runner_pool,
                                              source, runner, sketch.get(), clock));
  ASSIGN_OR_RETURN(queue, RequestQueue::Create(options.queue, *pipeline, clock));
  ASSIGN_OR_RETURN(node, Node::Create(options.node,
                                      {.pipeline = pipeline.get(),
                                       .queue = queue.get(),
                                       .memory = memory.get(),
                                       .kv = kv.get(),
                                       .emb = emb.get(),
                                       .device = device.get(),
                                       .events = events.get(),
                                       .residency = residency.get(),
                                       .refiller = refiller.get(),
                                       .tracker = tracker.get(),
                                       .row_bytes = runner.dim() * 4,
                                       .link_bytes_per_second = options.link.bytes_per_second,
                                       .max_queue = options.queue.max_queue},
                                      clock));
  return absl::OkStatus();
}

void LocalNode::Start() {
  memory->Start();
  node->Start();
}

LocalNode::~LocalNode() {
  if (node != nullptr) node->Stop();
  if (queue != nullptr) queue->Drain();
  if (memory != nullptr) memory->Stop();
  if (refiller != nullptr) refiller->Cancel();
}

}  // namespace hlem::serving
