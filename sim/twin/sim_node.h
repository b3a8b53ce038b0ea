#pragma once
// One serving node in the digital twin: the real memory system (HbmPool, KvCache, EmbCache,
// MemoryManager, PopularitySketch, Refiller, ResidencyTracker, residency event log) and the real
// serving::Node (admission, windows, load reports, α), on the simulated clock. Only the work of a
// request is modelled (SimExecutor): it makes the same cache calls as the Pipeline, in the same
// order, and takes its time from the cost model instead of computing anything.
//
// A request through SimExecutor (the Pipeline's steps, serving_node/core/pipeline.h):
//   1. The window start of the user's history (Pipeline::WindowStart's rule); Pin; the cached
//      prefix C: the user's K/V count when they were stored under the same window start (a moved
//      window would fail the real node's hash check: the K/V are evicted), then LookupPrefix;
//      Append reserves the slots of the new tokens (EventToken of each event, as the node hashes).
//   2. EMB: the distinct rows of the new history tokens and the candidates, per table in feature
//      order: Lookup, popularity sketch, residency tracker (of the sampled rows, when
//      emb_sample > 1). CPU work: request_overhead + lookup_per_row × rows, on the shared
//      compute units.
//   3. Per table with misses (and rows pending under another request's copy): one shard fetch
//      (fetch_overhead + fetch_per_row × rows, a delay; with shard faults, plus what failed
//      attempts cost, or UNAVAILABLE: SimShards), then ReserveBatch and one critical copy
//      per run of consecutive slots over the node's link (EmulatedLink, shared with refill), and
//      one staged copy of the fetched rows the cache did not take (no room at α = 0, or pending
//      under another request's copy): every row a request uses crosses the link once, as on a
//      GPU; the request waits for its copies, then Commit.
//   4. The batch's model step on the shared compute units (step_overhead + FLOPs ÷ rate), then
//      CommitAppend and Unpin, and the answer.
// One worker per node: batches of up to max_batch requests of distinct users run one after the
// other; a second request of a user in the queue waits for the next batch (the Pipeline runs it
// in a later round).
//
// Histories: the trace carries each request's new events only; events before them are
// regenerated from the workload generator (keyed by user and event index), so the twin keeps no
// histories. A request is an InferInput in delta form: `history` = the new events, `delta->len`
// = the events before them. With sketched histories (Parts::sketcher), a first visit's events are
// left out (InferInput::omitted_events) and they and regenerated events come from the sketcher:
// their sampled rows go to the EMB cache as row by row, their distinct rows are its expectation,
// and their K/V tokens are placeholders (the twin checks prefixes by window start, not hash).

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/memory_manager.h"
#include "serving_node/core/node.h"
#include "serving_node/core/popularity.h"
#include "serving_node/core/refill.h"
#include "serving_node/core/residency_events.h"
#include "serving_node/core/residency_state.h"
#include "serving_node/core/residency_tracker.h"
#include "serving_node/device/local_node.h"
#include "serving_node/model/hstu_config.h"
#include "sim/twin/cost_model.h"
#include "sim/twin/shared_compute.h"
#include "sim/twin/sim_device.h"
#include "sim/twin/sim_shards.h"
#include "sim/workload/history_sketch.h"
#include "sim/workload/workload.h"

namespace hlem::sim {

struct SimNodeOptions {
  serving::LocalNodeOptions local;  // as the node config resolves it (ResolveLocalNodeOptions)
  serving::HstuConfig model;        // the compute cost and the KV layout
  uint32_t kv_dtype_bytes = 4;      // the cpu runner stores fp32 K/V; bf16 on a GPU
  // EMB sampling (paper scale, docs/simulator.md): the EMB cache, popularity sketch, refill and
  // residency tracker see only the sampled rows (EmbSampled: one per aligned group of emb_sample
  // rows, at a keyed-hash offset), each entry holding emb_sample rows' bytes, so the cache tracks
  // 1 in emb_sample of the rows it would hold (spatial sampling, as SHARDS does for miss-ratio
  // curves, stratified). The other rows of a request miss at the
  // sampled rows' rate; lookups, fetches and copies are charged per row the request uses.
  // 1 = row level (exact).
  uint32_t emb_sample = 1;
};

class SimExecutor final : public serving::InferExecutor {
 public:
  struct Parts {
    serving::KvCache* kv = nullptr;
    serving::EmbCache* emb = nullptr;
    serving::Device* device = nullptr;
    serving::PopularitySketch* sketch = nullptr;   // may be null
    serving::ResidencyTracker* tracker = nullptr;  // may be null
    SimShards* shards = nullptr;                   // shard faults; null: fetches never fail
    uint32_t shard_client = 0;                     // this node's client of `shards`
    // Sketched histories (emb_sample >= 2): old and omitted events come from its sketches, not
    // row by row; null: row level.
    HistorySketcher* sketcher = nullptr;
  };
  SimExecutor(const SimNodeOptions& options, const CostModel& costs, SharedCompute& compute,
              const WorkloadGenerator& events, const Parts& parts, Clock& clock);
  ~SimExecutor() override;

  absl::Status Check(const serving::InferInput& in) const override;
  void Submit(serving::InferInput in, serving::RequestQueue::Done done) override;
  uint64_t queue_depth() const override { return queue_.size(); }
  size_t features() const override { return options_.local.pipeline.features.size(); }
  uint32_t max_history() const override { return options_.local.pipeline.max_history; }

  // Events left out of a history of `events` events (Pipeline::WindowStart's rule).
  uint64_t WindowStart(uint64_t events) const;

 private:
  struct Job;
  void MaybeStartBatch();
  void PrepareNext();
  void Prepare(Job& job);
  void FetchFrom(Job& job, size_t table);
  void CopyDone(Job& job);
  void Prepared(Job& job);
  void RunModel();
  void FinishBatch();

  const SimNodeOptions options_;
  const CostModel costs_;
  SharedCompute& compute_;
  const WorkloadGenerator& generator_;
  const Parts parts_;
  Clock& clock_;
  const uint32_t row_bytes_;    // one embedding row
  const uint32_t entry_bytes_;  // one EMB cache entry: emb_sample rows' bytes
  struct SampleRate {           // decayed counts of sampled rows looked up and missed, per table
    double missed = 0, looked_up = 0;
  };
  absl::flat_hash_map<uint32_t, SampleRate> sample_rate_;
  std::deque<std::unique_ptr<Job>> queue_;
  std::vector<std::unique_ptr<Job>> batch_;
  size_t next_ = 0;  // the batch's request being prepared
  bool busy_ = false;
  absl::flat_hash_map<uint64_t, uint64_t> kv_first_;  // user -> window start of its cached K/V
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// Rows for the refiller: the twin moves no bytes, a fetch is free (its time is the link's).
class SimRowSource final : public serving::RowSource {
 public:
  absl::Status Fetch(uint32_t, std::span<const uint64_t>, std::span<std::byte>,
                     absl::Time) override {
    return absl::OkStatus();
  }
};

struct SimNode {
  // Builds the node's parts in dependency order (LocalNode's, with the simulated device and
  // executor). `compute` and `events` are borrowed. Errors name the option.
  static absl::StatusOr<std::unique_ptr<SimNode>> Create(
      const SimNodeOptions& options, const CostModel& costs, SharedCompute& compute,
      const WorkloadGenerator& events, uint64_t epoch, Clock& clock, SimShards* shards = nullptr,
      HistorySketcher* sketcher = nullptr);
  ~SimNode();
  // Starts the memory manager's steps and the node's timers.
  void Start();

  SimRowSource source;
  std::unique_ptr<serving::HbmPool> pool;
  std::unique_ptr<SimDevice> device;
  std::unique_ptr<serving::ResidencyEventLog> events;
  std::shared_ptr<serving::ResidencyState> residency;
  std::unique_ptr<serving::KvCache> kv;
  std::unique_ptr<serving::EmbCache> emb;
  std::unique_ptr<serving::MemoryManager> memory;
  std::unique_ptr<serving::PopularitySketch> sketch;
  std::unique_ptr<serving::Refiller> refiller;
  std::unique_ptr<serving::ResidencyTracker> tracker;
  std::unique_ptr<SimExecutor> executor;
  std::unique_ptr<serving::Node> node;
};

}  // namespace hlem::sim
