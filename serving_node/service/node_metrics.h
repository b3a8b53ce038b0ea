#pragma once
// The serving node's metrics (hlem_node_*), declared once from the injected registry: request
// latency (with a bucket edge at the SLO) and codes, stage times, KV and EMB hits and misses,
// batch sizes (per answer / per batch), and gauges and counters sampled from the node by
// Refresh() (bytes per cache, α target and effective, queue depth, in-flight tokens, load, refill
// bytes and backlog, link busy time and bytes), and the punctuality of the node's timer thread
// (the critical path's clock: how many timers ran, how many late, the total and largest lag, the
// time spent inside timers and the longest one).
// Thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "serving_node/core/device.h"
#include "serving_node/core/node.h"

namespace hlem::serving {

class NodeMetrics {
 public:
  NodeMetrics(MetricsRegistry& registry, double slo_seconds);
  void ObserveAnswer(const NodeAnswer& answer);
  void ObserveBatch(size_t requests);
  // One of the node's clocks, by name: "critical" (the link's completions, windows, load
  // reports), "background" (refill, memory manager), "probes" (the shard client's probes).
  struct ClockStats {
    std::string name;
    TimerStats stats;
  };
  // Samples the node's gauges and cumulative counters, and its clocks' timer statistics (the
  // hlem_node_timer* families, labelled clock=<name>).
  void Refresh(const Node& node, const std::vector<ClockStats>& clocks);

 private:
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Histogram& latency_;
  prometheus::Family<prometheus::Histogram>& stage_;
  prometheus::Histogram* stage_fetch_;
  prometheus::Histogram* stage_copy_;
  prometheus::Histogram* stage_compute_;
  prometheus::Histogram* stage_kv_;
  prometheus::Family<prometheus::Counter>& kv_requests_;
  prometheus::Counter* kv_hit_;
  prometheus::Counter* kv_miss_;
  prometheus::Family<prometheus::Counter>& kv_tokens_;
  prometheus::Counter* kv_reused_;
  prometheus::Counter* kv_computed_;
  prometheus::Family<prometheus::Counter>& emb_rows_;
  prometheus::Counter* emb_hit_;
  prometheus::Counter* emb_miss_;
  prometheus::Counter& stale_;
  prometheus::Histogram& batch_;
  prometheus::Family<prometheus::Gauge>& cache_bytes_;
  prometheus::Family<prometheus::Gauge>& alpha_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& in_flight_tokens_;
  prometheus::Gauge& load_;
  prometheus::Gauge& kv_users_;
  prometheus::Gauge& emb_rows_resident_;
  prometheus::Gauge& refill_backlog_;
  prometheus::Gauge& draining_;
  prometheus::Counter& refill_bytes_;
  prometheus::Counter& link_busy_;
  prometheus::Family<prometheus::Counter>& link_bytes_;
  prometheus::Gauge& link_utilization_;
  prometheus::Family<prometheus::Counter>& timers_;
  prometheus::Family<prometheus::Counter>& timers_late_;
  prometheus::Family<prometheus::Counter>& timer_lag_;
  prometheus::Family<prometheus::Gauge>& timer_max_lag_;
  prometheus::Family<prometheus::Counter>& timer_busy_;
  prometheus::Family<prometheus::Gauge>& timer_max_callback_;

  absl::Mutex mu_;  // the last cumulative values seen by Refresh
  uint64_t last_refill_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_busy_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_link_bytes_[kNumCopyPurposes] ABSL_GUARDED_BY(mu_) = {};
  absl::flat_hash_map<std::string, TimerStats> last_timers_ ABSL_GUARDED_BY(mu_);  // by clock
};

}  // namespace hlem::serving
