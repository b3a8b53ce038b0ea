#include "embedding_shard/client/shard_client_metrics.h"

#include <string>

#include "absl/status/status.h"

namespace hlem::shard {

ShardClientMetrics::ShardClientMetrics(MetricsRegistry& registry, const std::string& transport)
    : transport_(transport),
      rows_(prometheus::BuildCounter()
                .Name("hlem_shard_client_rows_total")
                .Help("Embedding rows read from the shards")
                .Register(*registry.registry())
                .Add({{"transport", transport}})),
      bytes_(prometheus::BuildCounter()
                 .Name("hlem_shard_client_bytes_total")
                 .Help("Embedding bytes read from the shards")
                 .Register(*registry.registry())
                 .Add({{"transport", transport}})),
      latency_(prometheus::BuildHistogram()
                   .Name("hlem_shard_client_fetch_duration_seconds")
                   .Help("Time of one Fetch call (all servers, failovers included)")
                   .Register(*registry.registry())
                   .Add({{"transport", transport}}, ExponentialBuckets(1e-6, 2.5, 15))),
      errors_(prometheus::BuildCounter()
                  .Name("hlem_shard_client_errors_total")
                  .Help("Failed Fetch calls by status code")
                  .Register(*registry.registry())),
      failovers_(prometheus::BuildCounter()
                     .Name("hlem_shard_client_failovers_total")
                     .Help("Fetch calls that re-sent rows to another replica")
                     .Register(*registry.registry())
                     .Add({{"transport", transport}})),
      server_up_(prometheus::BuildGauge()
                     .Name("hlem_shard_client_server_up")
                     .Help("1 while the client considers the shard server healthy")
                     .Register(*registry.registry())),
      endpoint_transport_(prometheus::BuildGauge()
                              .Name("hlem_shard_client_transport_info")
                              .Help("1 for each UCX transport/device the endpoint to a shard uses")
                              .Register(*registry.registry())) {}

void ShardClientMetrics::OnFetch(size_t rows, size_t bytes, absl::Duration latency,
                                 absl::StatusCode code) {
  latency_.Observe(absl::ToDoubleSeconds(latency));
  if (code != absl::StatusCode::kOk) {
    errors_.Add({{"transport", transport_}, {"code", absl::StatusCodeToString(code)}}).Increment();
    return;
  }
  rows_.Increment(static_cast<double>(rows));
  bytes_.Increment(static_cast<double>(bytes));
}

void ShardClientMetrics::OnFailover() { failovers_.Increment(); }

void ShardClientMetrics::OnServerHealth(uint32_t server, bool healthy) {
  server_up_.Add({{"transport", transport_}, {"shard", std::to_string(server)}})
      .Set(healthy ? 1 : 0);
}

void ShardClientMetrics::SetEndpointTransports(uint32_t server,
                                               const std::vector<std::string>& transports) {
  for (const std::string& t : transports) {
    endpoint_transport_.Add({{"shard", std::to_string(server)}, {"transport", t}}).Set(1);
  }
}

}  // namespace hlem::shard
