#pragma once
// The allocator's gRPC shell (protos/hlem/v1/allocator.proto; read-only): GetStatus (the
// controller, the bounds, the epoch, every node's α and last decision) and ListDecisions (the
// decision log, to follow after an id), from the Allocator core. Also its Prometheus metrics
// (hlem_allocator_…) and the one-line log of each decision. Thread-safe.

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator_service/core/allocator.h"
#include "common/metrics.h"
#include "hlem/v1/allocator.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace hlem::allocator {

struct ServiceInfo {
  std::string controller;  // as configured ("hlem", "static", "pid", "ppo", ...)
  std::string policy_weights;
  Bounds bounds;
  absl::Time started_at;
};

hlem::v1::Decision ToProto(const DecisionRecord& r, const std::string& controller);

class AllocatorServiceImpl final : public hlem::v1::Allocator::Service {
 public:
  AllocatorServiceImpl(Allocator& allocator, ServiceInfo info)
      : allocator_(allocator), info_(std::move(info)) {}
  grpc::Status GetStatus(grpc::ServerContext* context, const hlem::v1::GetStatusRequest* request,
                         hlem::v1::GetStatusResponse* response) override;
  grpc::Status ListDecisions(grpc::ServerContext* context,
                             const hlem::v1::ListDecisionsRequest* request,
                             hlem::v1::ListDecisionsResponse* response) override;

 private:
  Allocator& allocator_;
  const ServiceInfo info_;
};

// hlem_allocator_alpha{node}, hlem_allocator_node_reachable{node}, hlem_allocator_decisions_total
// {reason}, hlem_allocator_decision_duration_seconds, hlem_allocator_round_duration_seconds,
// hlem_allocator_poll_failures_total, hlem_allocator_push_failures_total,
// hlem_allocator_nodes, hlem_allocator_last_decision{node,reason} (the α the node's last decision
// chose, labelled with its reason; one series per node).
class AllocatorMetrics {
 public:
  explicit AllocatorMetrics(MetricsRegistry& registry);
  // After a round: its figures, the decisions it made (read from the log after the last one
  // seen), each logged as one line, and every node's α.
  void AfterRound(const RoundStats& round, Allocator& allocator, const std::string& controller);

 private:
  prometheus::Family<prometheus::Gauge>& alpha_;
  prometheus::Family<prometheus::Gauge>& reachable_;
  prometheus::Family<prometheus::Counter>& decisions_;
  prometheus::Family<prometheus::Gauge>& last_decision_;
  prometheus::Histogram& decision_latency_;
  prometheus::Histogram& round_latency_;
  prometheus::Counter& poll_failures_;
  prometheus::Counter& push_failures_;
  prometheus::Gauge& nodes_;
  absl::Mutex mu_;
  uint64_t last_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::string> last_reason_ ABSL_GUARDED_BY(mu_);  // by node
};

}  // namespace hlem::allocator
