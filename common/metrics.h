#pragma once
// Prometheus plumbing. main() owns one MetricsRegistry and passes it (by reference) to every
// component, which declares its metric families in one struct built from registry() and keeps
// pre-resolved handles for the hot path. MetricsExposer serves the registry at /metrics.
// Names follow hlem_<subsystem>_<quantity>_<unit>; histograms are in seconds with an edge at the
// SLO (LatencyBuckets). prometheus::Registry and its metrics are thread-safe.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace hlem {

class MetricsRegistry {
 public:
  MetricsRegistry() : registry_(std::make_shared<prometheus::Registry>()) {}
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
};

// Latency edges in seconds: 1, 2.5, 5 per decade from 1e-5 s to 10 s, plus `slo_seconds` itself
// (exactly that double; a generated edge within 1e-9 relative of it is replaced). Ascending.
// A non-positive or non-finite SLO adds no edge.
prometheus::Histogram::BucketBoundaries LatencyBuckets(double slo_seconds);

// start, start*factor, ..., `count` edges. Empty unless start > 0, factor > 1 and count >= 1.
prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count);

// Serves GET /metrics over HTTP on its own threads until destroyed.
class MetricsExposer {
 public:
  // `bind` is "host:port"; port 0 picks a free one (see port()). UNAVAILABLE naming the address
  // when it cannot listen.
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Create(const std::string& bind,
                                                                MetricsRegistry& registry);
  int port() const { return port_; }

 private:
  MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer, int port,
                 std::shared_ptr<prometheus::Registry> registry)
      : registry_(std::move(registry)), exposer_(std::move(exposer)), port_(port) {}
  std::shared_ptr<prometheus::Registry> registry_;  // the exposer only holds a weak_ptr
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

}  // namespace hlem
