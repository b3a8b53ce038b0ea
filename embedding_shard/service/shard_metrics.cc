#include "embedding_shard/service/shard_metrics.h"

#include "absl/status/status.h"

namespace hlem::shard {
namespace {
const char* TransportLabel(ServeTransport t) {
  return t == ServeTransport::kGrpc ? "grpc" : "ucx_gather";
}
}  // namespace

ShardMetrics::ShardMetrics(MetricsRegistry& registry)
    : rows_(prometheus::BuildCounter()
                .Name("hlem_shard_rows_served_total")
                .Help("Embedding rows returned, by transport")
                .Register(*registry.registry())),
      bytes_(prometheus::BuildCounter()
                 .Name("hlem_shard_bytes_served_total")
                 .Help("Embedding bytes returned, by transport")
                 .Register(*registry.registry())),
      batch_rows_(prometheus::BuildHistogram()
                      .Name("hlem_shard_batch_rows")
                      .Help("Rows per served batch, by transport")
                      .Register(*registry.registry())),
      latency_(prometheus::BuildHistogram()
                   .Name("hlem_shard_request_duration_seconds")
                   .Help("Server-side time to serve one batch, by transport")
                   .Register(*registry.registry())),
      errors_(prometheus::BuildCounter()
                  .Name("hlem_shard_errors_total")
                  .Help("Rejected batches, by transport and status code")
                  .Register(*registry.registry())),
      ucx_transport_(prometheus::BuildGauge()
                         .Name("hlem_shard_ucx_transport_info")
                         .Help("1 for each UCX transport/device the shard's worker uses")
                         .Register(*registry.registry())),
      resident_bytes_(prometheus::BuildGauge()
                          .Name("hlem_shard_resident_bytes")
                          .Help("Table bytes held in memory by this shard")
                          .Register(*registry.registry())
                          .Add({})) {
  for (ServeTransport t : {ServeTransport::kGrpc, ServeTransport::kUcxGather}) {
    prometheus::Labels labels{{"transport", TransportLabel(t)}};
    per_transport_[static_cast<size_t>(t)] =
        PerTransport{&rows_.Add(labels), &bytes_.Add(labels),
                     &batch_rows_.Add(labels, ExponentialBuckets(1, 4, 9)),
                     &latency_.Add(labels, ExponentialBuckets(1e-6, 2.5, 15))};
  }
}

void ShardMetrics::Observe(ServeTransport transport, size_t rows, size_t bytes, double seconds,
                           absl::StatusCode code) {
  PerTransport& m = per_transport_[static_cast<size_t>(transport)];
  if (code != absl::StatusCode::kOk) {
    errors_
        .Add({{"transport", TransportLabel(transport)}, {"code", absl::StatusCodeToString(code)}})
        .Increment();
    return;
  }
  m.rows->Increment(static_cast<double>(rows));
  m.bytes->Increment(static_cast<double>(bytes));
  m.batch_rows->Observe(static_cast<double>(rows));
  m.latency->Observe(seconds);
}

void ShardMetrics::SetUcxTransports(const std::vector<std::string>& transports) {
  for (const std::string& t : transports) ucx_transport_.Add({{"transport", t}}).Set(1);
}

void ShardMetrics::SetResidentBytes(double bytes) { resident_bytes_.Set(bytes); }

}  // namespace hlem::shard
