#include "tools/loadgen/loadgen_metrics.h"

#include <utility>

#include "absl/status/status.h"

namespace hlem::loadgen {
namespace {

const std::string kNone = "none";

}  // namespace

LoadgenMetrics::LoadgenMetrics(MetricsRegistry& r, std::vector<PhaseSpan> phases, double slo_ms)
    : phases_(std::move(phases)),
      slo_ms_(slo_ms),
      requests_(prometheus::BuildCounter()
                    .Name("hlem_loadgen_requests_total")
                    .Help("Requests of the trace by outcome (gRPC status code) and regime")
                    .Register(*r.registry())),
      latency_(prometheus::BuildHistogram()
                   .Name("hlem_loadgen_request_duration_seconds")
                   .Help("Latency of OK answers at the client, sent to answered, by regime")
                   .Register(*r.registry())),
      slo_(prometheus::BuildCounter()
               .Name("hlem_loadgen_slo_requests_total")
               .Help("Requests answered OK within the SLO (met) or not (missed), by regime")
               .Register(*r.registry())),
      phase_(prometheus::BuildGauge()
                 .Name("hlem_loadgen_phase")
                 .Help("1 for the regime whose requests are being sent, 0 for the others")
                 .Register(*r.registry())) {
  for (const PhaseSpan& p : phases_) phase_.Add({{"regime", p.name}}).Set(0);
}

const std::string& LoadgenMetrics::RegimeAt(uint64_t scheduled_ns) const {
  for (const PhaseSpan& p : phases_) {
    if (scheduled_ns >= p.start_ns && scheduled_ns < p.end_ns) return p.name;
  }
  return kNone;
}

void LoadgenMetrics::Observe(const Outcome& o) {
  const std::string& regime = RegimeAt(o.scheduled_ns);
  const bool ok = o.code == static_cast<int>(absl::StatusCode::kOk);
  requests_
      .Add({{"regime", regime},
            {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(o.code))}})
      .Increment();
  if (ok) {
    latency_.Add({{"regime", regime}}, LatencyBuckets(slo_ms_ / 1e3))
        .Observe(static_cast<double>(o.latency_ns) / 1e9);
  }
  // The summary's test (Summarize), so the counts agree exactly.
  const bool met = ok && static_cast<double>(o.latency_ns) / 1e6 <= slo_ms_;
  slo_.Add({{"regime", regime}, {"result", met ? "met" : "missed"}}).Increment();
  absl::MutexLock lock(&mu_);
  if (regime != current_ && regime != kNone) {
    if (!current_.empty()) phase_.Add({{"regime", current_}}).Set(0);
    phase_.Add({{"regime", regime}}).Set(1);
    current_ = regime;
  }
}

}  // namespace hlem::loadgen
