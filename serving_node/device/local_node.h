#pragma once
// One whole serving node on the cpu device (or another: LocalNodeOptions::make_device), in this
// process, around any model runner and row source: pool, device, residency log and state, KV and
// EMB caches, memory manager, popularity sketch, refiller, residency tracker, pipeline, request
// queue and Node, built in dependency order and torn down in reverse (the node stops first, then
// the queue drains, then the background workers stop, and the pool goes last). NodeStack
// (serving_node/service) builds the HSTU model and the shard client around it; the cross-component
// tests and the simulator use it directly with a fake or cost-model runner.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/emulated_link.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/memory_manager.h"
#include "serving_node/core/model_runner.h"
#include "serving_node/core/node.h"
#include "serving_node/core/pipeline.h"
#include "serving_node/core/popularity.h"
#include "serving_node/core/refill.h"
#include "serving_node/core/request_queue.h"
#include "serving_node/core/residency_events.h"
#include "serving_node/core/residency_state.h"
#include "serving_node/core/residency_tracker.h"
#include "serving_node/core/row_source.h"
#include "serving_node/device/cpu_device.h"

namespace hlem::serving {

// A device holding the pool, and the pool's address as the model runner addresses it (the cpu
// device's arena; the cuda device's cudaMalloc'd pool).
struct PoolDevice {
  std::unique_ptr<Device> device;
  std::byte* runner_pool = nullptr;
};

struct LocalNodeOptions {
  NodeOptions node;  // id, SLO, windows, admission, load reports
  uint64_t pool_bytes = 256ull << 20;
  uint64_t page_bytes = 256 << 10;
  LinkOptions link;  // the cpu device's emulated host-to-device link
  // The device: unset, the cpu device (host arena, the emulated `link`); set, called once with
  // pool_bytes (NodeStack sets it for `device: cuda`, with the CUDA model runner).
  std::function<absl::StatusOr<PoolDevice>(uint64_t pool_bytes)> make_device;
  MemoryManagerOptions memory;
  EmbPolicy emb_policy = EmbPolicy::kTinyLfu;
  uint64_t residency_shard_rows = 4096;
  double residency_threshold = 0.5;
  uint32_t popularity_capacity = 65536;
  bool refill_enabled = true;
  RefillOptions refill;
  RequestQueueOptions queue;
  // Residency events kept for stream replay (a router that reconnects within them resumes; one
  // further behind takes a snapshot). 104 bytes each: 64 Ki hold 6.5 MiB, about 100 s of the
  // local profile's events. 1 Mi (104 MiB) grew the soak's nodes by 3.5 MiB/min for 25 minutes.
  uint64_t events_retained = 1 << 16;
  // The clock of the background work, whose timers may block for a while: the refiller (its plan
  // walks the popularity sketch, its fetch is a shard RPC) and the memory manager's reclaim steps.
  // Null: the node's clock. The serving_node binary gives them a RealClock of their own, so that
  // the timers of the critical path on the node's clock (the emulated link's completions, which
  // every miss waits for) never wait behind them (docs/node.md, "Background clock").
  Clock* background_clock = nullptr;
  // Features, limits; `on_lookup` is set to the residency tracker.
  PipelineOptions pipeline;
  // Row sizes of the features' tables as the row source serves them; a table not listed has
  // model-dim fp32 rows (4 · runner.dim() bytes). The pipeline rejects any other size.
  std::vector<EmbTableSpec> tables;
};

// The EMB cache's options for a node: the listed tables, and every feature table not listed with
// rows of `row_bytes` (the model's dim, fp32).
EmbCacheOptions EmbCacheOptionsFor(const LocalNodeOptions& options, uint32_t row_bytes);

struct LocalNode {
  // Builds everything; `source` and `runner` are borrowed and must outlive the node (or pass the
  // runner's ownership in `owned_runner`, which `runner` then names). `epoch` is the node's
  // incarnation. Errors name the option. Nothing is started: call Start().
  static absl::StatusOr<std::unique_ptr<LocalNode>> Build(const LocalNodeOptions& options,
                                                          RowSource& source, ModelRunner& runner,
                                                          uint64_t epoch, Clock& clock);
  virtual ~LocalNode();
  // Starts the memory manager's steps and the node's timers.
  void Start();

  std::unique_ptr<ModelRunner> owned_runner;  // optional
  std::unique_ptr<HbmPool> pool;
  std::unique_ptr<ResidencyEventLog> events;
  std::shared_ptr<ResidencyState> residency;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<EmbCache> emb;
  // Destroyed before the caches: a copy still in flight at shutdown (a request that gave up at
  // its deadline, a refill chunk) commits into the EMB cache when it lands, and the device runs
  // no completion once it is gone.
  std::unique_ptr<Device> device;
  std::unique_ptr<MemoryManager> memory;
  std::unique_ptr<PopularitySketch> sketch;
  std::unique_ptr<Refiller> refiller;
  std::unique_ptr<ResidencyTracker> tracker;
  std::unique_ptr<Pipeline> pipeline;
  std::unique_ptr<RequestQueue> queue;
  std::unique_ptr<Node> node;

 protected:
  // Fills the parts into this (an empty LocalNode or derived object).
  absl::Status Assemble(const LocalNodeOptions& options, RowSource& source, ModelRunner& runner,
                        uint64_t epoch, Clock& clock);
};

}  // namespace hlem::serving
