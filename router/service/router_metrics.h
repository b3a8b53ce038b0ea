#pragma once
// The router's metrics (hlem_router_*): Recommend answers by code and latency; decisions by policy
// and reason with their latency (µs buckets); the locality of the chosen node and the best one
// available (sums of h_kv and h_emb: their ratio is the locality given up for load); and, refreshed
// from the cluster once a second, each node's load and view (a node that left loses its series),
// event counters (applied, ignored, gaps, snapshots, epoch resets, filter full), cached profiles,
// index memory and the scorer's weights. SLO attainment: hlem_router_slo_requests_total{result=
// met|missed} (met: OK within the SLO at the router), hlem_router_slo_seconds, and the latency
// histogram has a bucket at the SLO. Retries elsewhere: hlem_router_retries_total{outcome=sent|
// over_budget} (router/core/retry_budget.h). Thread-safe.

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "router/core/cluster.h"
#include "router/core/concurrency_limit.h"

namespace hlem::router {

class RouterMetrics {
 public:
  RouterMetrics(MetricsRegistry& registry, PolicyKind policy, double slo_seconds);
  void ObserveDecision(const Decision& d, double seconds);
  void ObserveRecommend(int code, double seconds);
  // A failed attempt that RetryElsewhere allowed: sent, or held back by the retry budget.
  void ObserveRetry(bool sent);
  void Refresh(const Cluster& cluster);
  // The adaptive limit on calls in flight, when the router runs one (--adaptive-in-flight);
  // returns the phases at its minimum begun since the last call (the caller logs them).
  uint64_t RefreshLimit(const ConcurrencyLimitStats& s);

 private:
  const std::string policy_;
  prometheus::Family<prometheus::Counter>& decisions_;
  prometheus::Histogram& decision_latency_;
  prometheus::Family<prometheus::Counter>& locality_;
  prometheus::Counter* kv_chosen_;
  prometheus::Counter* kv_best_;
  prometheus::Counter* emb_chosen_;
  prometheus::Counter* emb_best_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Histogram& request_latency_;
  const double slo_seconds_;
  prometheus::Family<prometheus::Counter>& slo_requests_;
  prometheus::Counter* slo_met_;
  prometheus::Counter* slo_missed_;
  prometheus::Family<prometheus::Counter>& retries_;
  prometheus::Counter* retries_sent_;
  prometheus::Counter* retries_over_budget_;
  prometheus::Family<prometheus::Gauge>& node_load_;
  prometheus::Family<prometheus::Gauge>& node_view_;
  prometheus::Family<prometheus::Gauge>& node_users_;
  prometheus::Family<prometheus::Gauge>& events_;
  prometheus::Gauge& profiles_;
  prometheus::Gauge& index_bytes_;
  prometheus::Family<prometheus::Gauge>& weights_;
  prometheus::Gauge& in_flight_limit_;
  prometheus::Gauge& in_flight_baseline_;
  prometheus::Gauge& measuring_baseline_;
  prometheus::Counter& in_flight_refused_;
  prometheus::Counter& forced_baselines_;
  absl::Mutex mu_;                                         // one Refresh at a time
  ConcurrencyLimitStats limit_seen_ ABSL_GUARDED_BY(mu_);  // at the last RefreshLimit
  std::vector<std::string> shown_ ABSL_GUARDED_BY(mu_);    // node ids with gauges
};

}  // namespace hlem::router
