#include "serving_node/service/node_metrics.h"

#include "absl/status/status.h"

namespace hlem::serving {
namespace {

prometheus::Family<prometheus::Counter>& Counter(MetricsRegistry& r, const char* name,
                                                 const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(*r.registry());
}
prometheus::Family<prometheus::Gauge>& Gauge(MetricsRegistry& r, const char* name,
                                             const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(*r.registry());
}
prometheus::Family<prometheus::Histogram>& Histogram(MetricsRegistry& r, const char* name,
                                                     const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(*r.registry());
}

// Adds what a cumulative source counted since the last sample (sources only grow; a reset one
// starts again from 0).
void Advance(prometheus::Counter& c, uint64_t now, uint64_t* last, double scale = 1) {
  const uint64_t delta = now >= *last ? now - *last : now;
  if (delta > 0) c.Increment(static_cast<double>(delta) * scale);
  *last = now;
}

}  // namespace

NodeMetrics::NodeMetrics(MetricsRegistry& r, double slo_seconds)
    : requests_(Counter(r, "hlem_node_requests_total", "Infer answers, by gRPC status code")),
      latency_(Histogram(r, "hlem_node_request_duration_seconds",
                         "Infer latency at the node, receipt to answer (bucket edge at the SLO)")
                   .Add({}, LatencyBuckets(slo_seconds))),
      stage_(Histogram(r, "hlem_node_stage_duration_seconds",
                       "Time of one successful Infer in each stage")),
      stage_fetch_(&stage_.Add({{"stage", "emb_fetch"}}, LatencyBuckets(slo_seconds))),
      stage_copy_(&stage_.Add({{"stage", "emb_copy"}}, LatencyBuckets(slo_seconds))),
      stage_compute_(&stage_.Add({{"stage", "compute"}}, LatencyBuckets(slo_seconds))),
      stage_kv_(&stage_.Add({{"stage", "kv"}}, LatencyBuckets(slo_seconds))),
      kv_requests_(
          Counter(r, "hlem_node_kv_requests_total",
                  "Successful Infer requests that reused a cached KV prefix (hit) or not")),
      kv_hit_(&kv_requests_.Add({{"result", "hit"}})),
      kv_miss_(&kv_requests_.Add({{"result", "miss"}})),
      kv_tokens_(Counter(r, "hlem_node_kv_tokens_total",
                         "History tokens reused from the KV cache or computed")),
      kv_reused_(&kv_tokens_.Add({{"kind", "reused"}})),
      kv_computed_(&kv_tokens_.Add({{"kind", "computed"}})),
      emb_rows_(Counter(r, "hlem_node_emb_rows_total",
                        "Distinct embedding rows per request served by the EMB cache or fetched")),
      emb_hit_(&emb_rows_.Add({{"result", "hit"}})),
      emb_miss_(&emb_rows_.Add({{"result", "miss"}})),
      stale_(Counter(r, "hlem_node_stale_kv_hits_total",
                     "Requests the router sent expecting KV residency that found no prefix")
                 .Add({})),
      batch_(Histogram(r, "hlem_node_batch_size", "Requests per model batch")
                 .Add({}, ExponentialBuckets(1, 2, 10))),
      cache_bytes_(Gauge(r, "hlem_node_pool_bytes", "Pool bytes by owner (kv, emb, free)")),
      alpha_(Gauge(r, "hlem_node_alpha", "EMB share of the pool: target and effective")),
      queue_depth_(Gauge(r, "hlem_node_queue_depth", "Requests waiting for compute").Add({})),
      in_flight_tokens_(
          Gauge(r, "hlem_node_in_flight_tokens", "Tokens of admitted, unanswered requests")
              .Add({})),
      load_(Gauge(r, "hlem_node_load", "Router load signal in [0, 1]").Add({})),
      kv_users_(Gauge(r, "hlem_node_kv_resident_users", "Users with cached KV").Add({})),
      emb_rows_resident_(
          Gauge(r, "hlem_node_emb_resident_rows", "Embedding rows in the EMB cache").Add({})),
      refill_backlog_(
          Gauge(r, "hlem_node_refill_backlog_bytes", "Bytes of planned refill rows not yet issued")
              .Add({})),
      draining_(Gauge(r, "hlem_node_draining", "1 while the node drains").Add({})),
      refill_bytes_(
          Counter(r, "hlem_node_refill_bytes_total", "Bytes copied to the device by refill")
              .Add({})),
      link_busy_(Counter(r, "hlem_node_link_busy_seconds_total",
                         "Time the host-to-device link spent moving bytes")
                     .Add({})),
      link_bytes_(Counter(r, "hlem_node_link_bytes_total",
                          "Bytes copied to the device, by purpose (emb_miss, emb_refill, kv)")),
      link_utilization_(Gauge(r, "hlem_node_link_utilization_ratio",
                              "Link busy time / window length, last closed window")
                            .Add({})),
      timers_(Counter(r, "hlem_node_timers_total",
                      "Timers run on the node's clock `clock` (critical: link completions, "
                      "windows, load reports; background: refill, memory manager; probes: the "
                      "shard client's probes)")),
      timers_late_(Counter(r, "hlem_node_timers_late_total",
                           "Timers of the node's clock `clock` that ran at least `by` after their "
                           "time")),
      timer_lag_(Counter(r, "hlem_node_timer_lag_seconds_total",
                         "Total time the timers of the node's clock `clock` ran after their time")),
      timer_max_lag_(
          Gauge(r, "hlem_node_timer_max_lag_seconds",
                "The largest lag of a timer of the node's clock `clock` since the start")),
      timer_busy_(Counter(r, "hlem_node_timer_busy_seconds_total",
                          "Time the timer thread of the node's clock `clock` spent inside timers "
                          "(lag with little busy time is CPU contention, not a long timer)")),
      timer_max_callback_(Gauge(r, "hlem_node_timer_max_callback_seconds",
                                "The longest timer of the node's clock `clock` since the start")) {}

void NodeMetrics::ObserveAnswer(const NodeAnswer& a) {
  requests_.Add({{"code", absl::StatusCodeToString(a.code)}}).Increment();
  latency_.Observe(absl::ToDoubleSeconds(a.latency));
  if (a.output == nullptr) return;
  const InferOutput& o = *a.output;
  stage_fetch_->Observe(absl::ToDoubleSeconds(o.fetch_seconds));
  stage_copy_->Observe(absl::ToDoubleSeconds(o.copy_seconds));
  stage_compute_->Observe(absl::ToDoubleSeconds(o.compute_seconds));
  stage_kv_->Observe(absl::ToDoubleSeconds(o.kv_seconds));
  (o.cached_prefix_tokens > 0 ? kv_hit_ : kv_miss_)->Increment();
  kv_reused_->Increment(o.cached_prefix_tokens);
  kv_computed_->Increment(o.history_tokens - o.cached_prefix_tokens);
  emb_hit_->Increment(static_cast<double>(o.emb_hits));
  emb_miss_->Increment(static_cast<double>(o.emb_misses));
  if (o.stale_kv_hit) stale_.Increment();
}

void NodeMetrics::ObserveBatch(size_t requests) { batch_.Observe(static_cast<double>(requests)); }

void NodeMetrics::Refresh(const Node& node, const std::vector<ClockStats>& clocks) {
  const NodeGaugesNow g = node.Gauges();
  cache_bytes_.Add({{"owner", "kv"}}).Set(static_cast<double>(g.kv_bytes));
  cache_bytes_.Add({{"owner", "emb"}}).Set(static_cast<double>(g.emb_bytes));
  cache_bytes_.Add({{"owner", "free"}}).Set(static_cast<double>(g.free_bytes));
  alpha_.Add({{"kind", "target"}}).Set(g.alpha_target);
  alpha_.Add({{"kind", "effective"}}).Set(g.alpha_effective);
  queue_depth_.Set(g.queue_depth);
  in_flight_tokens_.Set(static_cast<double>(g.in_flight_tokens));
  load_.Set(g.load);
  kv_users_.Set(static_cast<double>(g.kv_resident_users));
  emb_rows_resident_.Set(static_cast<double>(g.emb_resident_rows));
  refill_backlog_.Set(static_cast<double>(g.refill_backlog_bytes));
  draining_.Set(g.draining ? 1 : 0);
  const DeviceCopyStats d = node.parts().device->stats();
  const uint64_t refilled =
      node.parts().refiller != nullptr ? node.parts().refiller->GetStats().bytes_refilled : 0;
  const std::vector<NodeWindow> last = node.Windows(1);
  if (!last.empty()) link_utilization_.Set(last.back().link_utilization_ratio);
  absl::MutexLock lock(&mu_);
  for (const ClockStats& c : clocks) {
    const TimerStats& t = c.stats;
    const prometheus::Labels labels = {{"clock", c.name}};
    timer_max_lag_.Add(labels).Set(static_cast<double>(t.max_lag_ns) * 1e-9);
    timer_max_callback_.Add(labels).Set(static_cast<double>(t.max_callback_ns) * 1e-9);
    TimerStats& last = last_timers_[c.name];
    Advance(timers_.Add(labels), t.timers, &last.timers);
    Advance(timers_late_.Add({{"clock", c.name}, {"by", "1ms"}}), t.late_1ms, &last.late_1ms);
    Advance(timers_late_.Add({{"clock", c.name}, {"by", "10ms"}}), t.late_10ms, &last.late_10ms);
    Advance(timer_lag_.Add(labels), t.lag_ns, &last.lag_ns, 1e-9);
    Advance(timer_busy_.Add(labels), t.busy_ns, &last.busy_ns, 1e-9);
  }
  Advance(refill_bytes_, refilled, &last_refill_bytes_);
  Advance(link_busy_, d.link_busy_ns, &last_busy_ns_, 1e-9);
  for (int p = 0; p < kNumCopyPurposes; ++p) {
    Advance(link_bytes_.Add({{"purpose", CopyPurposeName(static_cast<CopyPurpose>(p))}}),
            d.bytes[p], &last_link_bytes_[p]);
  }
}

}  // namespace hlem::serving
