#include "router/service/router_metrics.h"

#include <algorithm>

#include "absl/status/status.h"

namespace hlem::router {
namespace {

template <typename T>
prometheus::Family<T>& Build(MetricsRegistry& r, const char* name, const char* help);
template <>
prometheus::Family<prometheus::Counter>& Build(MetricsRegistry& r, const char* name,
                                               const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*r.registry());
}
template <>
prometheus::Family<prometheus::Gauge>& Build(MetricsRegistry& r, const char* name,
                                             const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*r.registry());
}
template <>
prometheus::Family<prometheus::Histogram>& Build(MetricsRegistry& r, const char* name,
                                                 const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(*r.registry());
}

}  // namespace

RouterMetrics::RouterMetrics(MetricsRegistry& r, PolicyKind policy, double slo_seconds)
    : policy_(PolicyName(policy)),
      decisions_(Build<prometheus::Counter>(r, "hlem_router_decisions_total",
                                            "Routing decisions by policy and reason")),
      decision_latency_(Build<prometheus::Histogram>(r, "hlem_router_decision_duration_seconds",
                                                     "Time of one routing decision")
                            .Add({}, ExponentialBuckets(1e-7, 2, 16))),
      locality_(Build<prometheus::Counter>(
          r, "hlem_router_locality_score_total",
          "Sum of h_kv / h_emb of the chosen node and of the best routable node")),
      kv_chosen_(&locality_.Add({{"signal", "kv"}, {"of", "chosen"}})),
      kv_best_(&locality_.Add({{"signal", "kv"}, {"of", "best"}})),
      emb_chosen_(&locality_.Add({{"signal", "emb"}, {"of", "chosen"}})),
      emb_best_(&locality_.Add({{"signal", "emb"}, {"of", "best"}})),
      requests_(Build<prometheus::Counter>(r, "hlem_router_requests_total",
                                           "Recommend answers by gRPC status code")),
      request_latency_(Build<prometheus::Histogram>(r, "hlem_router_request_duration_seconds",
                                                    "Recommend latency at the router")
                           .Add({}, LatencyBuckets(slo_seconds))),
      slo_seconds_(slo_seconds),
      slo_requests_(Build<prometheus::Counter>(
          r, "hlem_router_slo_requests_total",
          "Recommend answers: OK within the SLO at the router (met) or not (missed)")),
      slo_met_(&slo_requests_.Add({{"result", "met"}})),
      slo_missed_(&slo_requests_.Add({{"result", "missed"}})),
      retries_(Build<prometheus::Counter>(
          r, "hlem_router_retries_total",
          "Retries on another node after a node refused at admission or was unavailable: sent, "
          "or over the retry budget (answered with the first attempt's error)")),
      retries_sent_(&retries_.Add({{"outcome", "sent"}})),
      retries_over_budget_(&retries_.Add({{"outcome", "over_budget"}})),
      node_load_(Build<prometheus::Gauge>(r, "hlem_router_node_load", "l(n) used for routing")),
      node_view_(Build<prometheus::Gauge>(
          r, "hlem_router_node_view",
          "The router's view of a node: 0 exact, 1 degraded, 2 unreachable")),
      node_users_(Build<prometheus::Gauge>(r, "hlem_router_node_resident_users",
                                           "Users whose K/V the router believes resident")),
      events_(Build<prometheus::Gauge>(r, "hlem_router_residency_events",
                                       "Residency protocol counters (applied, ignored, gaps, "
                                       "snapshots, epoch_resets, filter_full)")),
      profiles_(Build<prometheus::Gauge>(r, "hlem_router_cached_profiles",
                                         "Users with a cached shard profile")
                    .Add({})),
      index_bytes_(
          Build<prometheus::Gauge>(r, "hlem_router_index_bytes", "Memory of the routing index")
              .Add({})),
      weights_(Build<prometheus::Gauge>(
          r, "hlem_router_weight",
          "The scorer's weights w_kv, w_emb, w_ld (configured, or calibrated online)")),
      in_flight_limit_(Build<prometheus::Gauge>(
                           r, "hlem_router_in_flight_limit",
                           "The adaptive limit on Recommend calls in flight (--adaptive-in-flight)")
                           .Add({})),
      in_flight_baseline_(Build<prometheus::Gauge>(r, "hlem_router_in_flight_baseline_seconds",
                                                   "The unloaded latency the adaptive limit "
                                                   "allows a multiple of (0 until measured)")
                              .Add({})),
      measuring_baseline_(
          Build<prometheus::Gauge>(r, "hlem_router_in_flight_measuring_baseline",
                                   "1 while the adaptive limit measures the unloaded latency")
              .Add({})),
      in_flight_refused_(Build<prometheus::Counter>(r, "hlem_router_in_flight_refused_total",
                                                    "Recommend calls the adaptive limit refused")
                             .Add({})),
      forced_baselines_(
          Build<prometheus::Counter>(r, "hlem_router_in_flight_forced_baselines_total",
                                     "Phases at the adaptive limit's minimum to measure the "
                                     "unloaded latency (the router busy for too long)")
              .Add({})) {
  Build<prometheus::Gauge>(r, "hlem_router_slo_seconds",
                           "The latency objective SLO attainment is counted against")
      .Add({})
      .Set(slo_seconds);
}

void RouterMetrics::ObserveDecision(const Decision& d, double seconds) {
  decisions_.Add({{"policy", policy_}, {"reason", ReasonName(d.reason)}}).Increment();
  decision_latency_.Observe(seconds);
  if (d.node < 0) return;
  kv_chosen_->Increment(d.h_kv);
  kv_best_->Increment(d.best_h_kv);
  emb_chosen_->Increment(d.h_emb);
  emb_best_->Increment(d.best_h_emb);
}

void RouterMetrics::ObserveRetry(bool sent) {
  (sent ? retries_sent_ : retries_over_budget_)->Increment();
}

void RouterMetrics::ObserveRecommend(int code, double seconds) {
  requests_.Add({{"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}})
      .Increment();
  request_latency_.Observe(seconds);
  (code == 0 && seconds <= slo_seconds_ ? slo_met_ : slo_missed_)->Increment();
}

uint64_t RouterMetrics::RefreshLimit(const ConcurrencyLimitStats& s) {
  absl::MutexLock lock(&mu_);
  in_flight_refused_.Increment(static_cast<double>(s.refused - limit_seen_.refused));
  const uint64_t forced = s.forced_baselines - limit_seen_.forced_baselines;
  forced_baselines_.Increment(static_cast<double>(forced));
  limit_seen_ = s;
  in_flight_limit_.Set(s.limit);
  in_flight_baseline_.Set(absl::ToDoubleSeconds(s.baseline));
  measuring_baseline_.Set(s.measuring_baseline ? 1 : 0);
  return forced;
}

void RouterMetrics::Refresh(const Cluster& cluster) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> now;
  for (const NodeStatus& n : cluster.Nodes()) {
    node_load_.Add({{"node", n.id}}).Set(n.load);
    node_view_.Add({{"node", n.id}}).Set(static_cast<double>(n.view));
    node_users_.Add({{"node", n.id}}).Set(static_cast<double>(n.resident_users));
    now.push_back(n.id);
  }
  for (const std::string& id : shown_) {
    if (std::find(now.begin(), now.end(), id) != now.end()) continue;
    for (prometheus::Family<prometheus::Gauge>* f : {&node_load_, &node_view_, &node_users_}) {
      f->Remove(&f->Add({{"node", id}}));
    }
  }
  shown_ = std::move(now);
  const ClusterStats s = cluster.Stats();
  events_.Add({{"counter", "applied"}}).Set(static_cast<double>(s.events_applied));
  events_.Add({{"counter", "ignored"}}).Set(static_cast<double>(s.events_ignored));
  events_.Add({{"counter", "gaps"}}).Set(static_cast<double>(s.gaps));
  events_.Add({{"counter", "snapshots"}}).Set(static_cast<double>(s.snapshots));
  events_.Add({{"counter", "epoch_resets"}}).Set(static_cast<double>(s.epoch_resets));
  events_.Add({{"counter", "filter_full"}}).Set(static_cast<double>(s.filter_full));
  profiles_.Set(static_cast<double>(s.cached_profiles));
  index_bytes_.Set(static_cast<double>(s.index_bytes));
  const Weights w = cluster.weights();
  weights_.Add({{"signal", "kv"}}).Set(w.kv);
  weights_.Add({{"signal", "emb"}}).Set(w.emb);
  weights_.Add({{"signal", "load"}}).Set(w.load);
}

}  // namespace hlem::router
