#pragma once
// Per-window statistics of the memory system, as ARCHITECTURE §3 defines them for the allocator:
//   KV hit rate      = reused cached tokens / history tokens requested (token-weighted),
//   KV user hit rate = lookups that reused ≥ 1 token / lookups,
//   EMB hit rate     = rows served from the cache / rows looked up (after deduplication),
// plus bytes per cache, target and effective α, refill bytes and backlog, and link utilisation
// (time the link carried transfers / window length).
//
// The sources keep cumulative counters; ReadMemoryCounters samples them, and WindowAggregator
// turns two samples into one window. A window with nothing to divide reports a rate of 0 and
// says so (`kv_requests == 0`, `emb_rows == 0`). The aggregator keeps the last `keep` windows.
// Thread-safe.

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "serving_node/core/device.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/memory_manager.h"
#include "serving_node/core/refill.h"

namespace hlem::serving {

// One sample of the sources' cumulative counters and gauges.
struct MemoryCounters {
  absl::Time at;
  // cumulative
  uint64_t kv_lookups = 0;
  uint64_t kv_lookup_hits = 0;
  uint64_t kv_tokens_requested = 0;
  uint64_t kv_tokens_reused = 0;
  uint64_t emb_rows = 0;
  uint64_t emb_hits = 0;
  uint64_t refill_bytes = 0;
  uint64_t miss_bytes = 0;  // EMB miss copies over the link
  uint64_t link_busy_ns = 0;
  // gauges
  uint64_t kv_bytes = 0;
  uint64_t emb_bytes = 0;
  double alpha_target = 0;
  double alpha_effective = 0;
  uint64_t refill_backlog_rows = 0;
};

// `refiller` may be null (no refill configured).
MemoryCounters ReadMemoryCounters(const KvCache& kv, const EmbCache& emb,
                                  const MemoryManager& manager, const Refiller* refiller,
                                  const Device& device, absl::Time now);

struct MemoryWindow {
  uint64_t index = 0;
  absl::Time start;
  absl::Duration duration;
  uint64_t kv_requests = 0;  // lookups in the window
  double kv_hit_rate = 0;
  double kv_user_hit_rate = 0;
  uint64_t emb_rows = 0;
  double emb_hit_rate = 0;
  uint64_t kv_bytes = 0;
  uint64_t emb_bytes = 0;
  double alpha_target = 0;
  double alpha_effective = 0;
  uint64_t refill_bytes = 0;
  uint64_t refill_backlog_rows = 0;
  uint64_t miss_bytes = 0;
  double link_utilisation = 0;  // in [0, 1]
};

class WindowAggregator {
 public:
  explicit WindowAggregator(size_t keep = 12) : keep_(keep) {}
  // Starts the first window at `sample` (later calls restart the window, dropping nothing kept).
  void Start(const MemoryCounters& sample);
  // Closes the window that began at the previous sample, records it and starts the next one.
  MemoryWindow Close(const MemoryCounters& sample);
  std::vector<MemoryWindow> Recent() const;  // oldest first

 private:
  const size_t keep_;
  mutable absl::Mutex mu_;
  MemoryCounters last_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<MemoryWindow> windows_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::serving
