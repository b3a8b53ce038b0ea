#pragma once
// The shard server's metrics (hlem_shard_*), declared once from the injected registry. Labels:
// transport = grpc | ucx_gather (one-sided UCX reads never reach the server's CPU and are counted
// by the clients), code = canonical status code name. Thread-safe.

#include <array>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace hlem::shard {

enum class ServeTransport { kGrpc = 0, kUcxGather = 1 };

class ShardMetrics {
 public:
  explicit ShardMetrics(MetricsRegistry& registry);
  void Observe(ServeTransport transport, size_t rows, size_t bytes, double seconds,
               absl::StatusCode code);
  // Marks the UCX transports in use (hlem_shard_ucx_transport_info{transport="posix/memory"} 1).
  void SetUcxTransports(const std::vector<std::string>& transports);
  void SetResidentBytes(double bytes);

 private:
  struct PerTransport {
    prometheus::Counter* rows;
    prometheus::Counter* bytes;
    prometheus::Histogram* batch_rows;
    prometheus::Histogram* latency;
  };
  prometheus::Family<prometheus::Counter>& rows_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Histogram>& batch_rows_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& errors_;
  prometheus::Family<prometheus::Gauge>& ucx_transport_;
  prometheus::Gauge& resident_bytes_;
  std::array<PerTransport, 2> per_transport_;
};

}  // namespace hlem::shard
