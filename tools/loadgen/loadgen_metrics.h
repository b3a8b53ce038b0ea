#pragma once
// The load generator's own metrics (`hlem loadgen --metrics-listen`), labelled by the trace's
// phase — the regime (steady, trend, burst) — which the servers cannot know: every outcome as the
// client saw it, so dashboards can show SLO attainment and P50/P99 per regime next to the
// servers' figures. hlem_loadgen_requests_total{regime,code},
// hlem_loadgen_request_duration_seconds{regime} (OK answers, sent to answered; a bucket edge at the
// SLO), hlem_loadgen_slo_requests_total{regime,result=met|missed} (failures are misses, as in the
// summary), hlem_loadgen_phase{regime} (1 for the phase being sent now, 0 for the others).
// Thread-safe.

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "tools/loadgen/summary.h"

namespace hlem::loadgen {

class LoadgenMetrics {
 public:
  // `phases`: the replay's phase spans (PhaseSpans); a request outside every span is "none".
  LoadgenMetrics(MetricsRegistry& registry, std::vector<PhaseSpan> phases, double slo_ms);
  void Observe(const Outcome& o);

 private:
  const std::string& RegimeAt(uint64_t scheduled_ns) const;

  const std::vector<PhaseSpan> phases_;
  const double slo_ms_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& slo_;
  prometheus::Family<prometheus::Gauge>& phase_;
  absl::Mutex mu_;
  std::string current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::loadgen
