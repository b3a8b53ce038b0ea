#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hlem {

prometheus::Histogram::BucketBoundaries LatencyBuckets(double slo_seconds) {
  bool add_slo = std::isfinite(slo_seconds) && slo_seconds > 0;
  prometheus::Histogram::BucketBoundaries edges;
  for (int exp = -5; exp <= 1; ++exp) {
    for (const char* mantissa : {"1", "2.5", "5"}) {
      // Parsing the decimal gives the double nearest to it (0.05, not 5 * 0.01).
      double edge = std::stod(absl::StrCat(mantissa, "e", exp));
      if (edge > 10.0) break;
      if (add_slo && std::abs(edge - slo_seconds) <= 1e-9 * slo_seconds) continue;
      edges.push_back(edge);
    }
  }
  if (add_slo) edges.insert(std::upper_bound(edges.begin(), edges.end(), slo_seconds), slo_seconds);
  return edges;
}

prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries edges;
  if (!(start > 0) || !(factor > 1) || count < 1) return edges;
  double edge = start;
  for (int i = 0; i < count; ++i, edge *= factor) edges.push_back(edge);
  return edges;
}

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Create(const std::string& bind,
                                                                       MetricsRegistry& registry) {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::vector<int> ports;
  try {
    exposer = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/2);
    exposer->RegisterCollectable(registry.registry());
    ports = exposer->GetListeningPorts();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", bind, ": ", e.what()));
  }
  if (ports.empty() || ports.front() <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: no listening port for ", bind));
  }
  return std::unique_ptr<MetricsExposer>(
      new MetricsExposer(std::move(exposer), ports.front(), registry.registry()));
}

}  // namespace hlem
