#pragma once
// Client-side shard metrics (hlem_shard_client_*), fed by ShardClient through the
// ShardClientObserver interface and by the UCX transport's on_connected hook. One-sided reads
// never reach the shard's CPU, so these are the only figures for them. Thread-safe.

#include <string>
#include <vector>

#include "common/metrics.h"
#include "embedding_shard/core/shard_client.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace hlem::shard {

class ShardClientMetrics final : public ShardClientObserver {
 public:
  // `transport` ("ucx" or "grpc") becomes a label of every series.
  ShardClientMetrics(MetricsRegistry& registry, const std::string& transport);

  void OnFetch(size_t rows, size_t bytes, absl::Duration latency, absl::StatusCode code) override;
  void OnFailover() override;
  void OnServerHealth(uint32_t server, bool healthy) override;
  // hlem_shard_client_transport_info{shard, transport=<lane transport>} = 1.
  void SetEndpointTransports(uint32_t server, const std::vector<std::string>& transports);

 private:
  std::string transport_;
  prometheus::Counter& rows_;
  prometheus::Counter& bytes_;
  prometheus::Histogram& latency_;
  prometheus::Family<prometheus::Counter>& errors_;
  prometheus::Counter& failovers_;
  prometheus::Family<prometheus::Gauge>& server_up_;
  prometheus::Family<prometheus::Gauge>& endpoint_transport_;
};

}  // namespace hlem::shard
