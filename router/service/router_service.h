#pragma once
// The gRPC shell of the router (protos/hlem/v1/router.proto): Recommend checks the request, asks
// the Cluster for a node, forwards the request as the node's Infer with the caller's deadline and
// the router's KV belief, retries once on the next-best node when the node is unavailable or full
// and the deadline allows, and answers with the node's scores and the routing decision.
// GetRoutingState reports the cluster's view. Thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/grpc_security.h"
#include "hlem/v1/router.grpc.pb.h"
#include "hlem/v1/serving_node.grpc.pb.h"
#include "router/core/calibration.h"
#include "router/core/cluster.h"
#include "router/core/concurrency_limit.h"
#include "router/core/retry_budget.h"
#include "router/service/router_metrics.h"

namespace hlem::router {

struct RouterServiceOptions {
  uint32_t max_candidates = 512;
  uint32_t max_history_events = 1 << 16;
  bool retry = true;
  // Retries within this budget (router/core/retry_budget.h); beyond it, the first error.
  RetryBudgetOptions retry_budget;
  Clock* clock = nullptr;  // the retry budget's (RealClock when null)
  // Recommend calls being handled at once; beyond it a call is answered RESOURCE_EXHAUSTED at
  // once (0 = no limit): under overload the router sheds at its door instead of queueing.
  uint32_t max_in_flight = 0;
  // When set, calls beyond its adaptive limit are answered RESOURCE_EXHAUSTED too (after the
  // fixed one); it is fed the latency of every answer (full samples), and of every call that ran
  // out of time at a node or was shed late there (load samples; router/core/concurrency_limit.h).
  // Borrowed.
  ConcurrencyLimit* concurrency_limit = nullptr;
  // Fed with every answer's costs when set (online calibration; the caller applies its weights).
  CostCalibrator* calibrator = nullptr;
  // When set, every call needs 'authorization: Bearer <token>' (the frontends' token).
  const TokenFile* frontend_token = nullptr;
};

class RouterServiceImpl final : public hlem::v1::Router::Service {
 public:
  // `metrics` may be null.
  RouterServiceImpl(const RouterServiceOptions& options, Cluster& cluster,
                    RouterMetrics* metrics = nullptr)
      : options_(options),
        cluster_(cluster),
        metrics_(metrics),
        retry_budget_(options.retry_budget,
                      options.clock != nullptr ? *options.clock : RealClock::Get()) {}

  RetryBudgetStats retry_stats() const { return retry_budget_.Stats(); }

  // The stub used to reach the cluster's node `index`.
  void SetNodeStub(int index, std::shared_ptr<hlem::v1::ServingNode::StubInterface> stub);

  grpc::Status Recommend(grpc::ServerContext* context, const hlem::v1::RecommendRequest* request,
                         hlem::v1::RecommendResponse* response) override;
  grpc::Status GetRoutingState(grpc::ServerContext* context,
                               const hlem::v1::GetRoutingStateRequest* request,
                               hlem::v1::GetRoutingStateResponse* response) override;

 private:
  std::shared_ptr<hlem::v1::ServingNode::StubInterface> Stub(int index) const;
  // `sample`: what the answer's latency is worth to the adaptive limit (left as it is when
  // nothing).
  grpc::Status Route(grpc::ServerContext* context, const hlem::v1::RecommendRequest* request,
                     hlem::v1::RecommendResponse* response, LatencySample* sample);

  const RouterServiceOptions options_;
  Cluster& cluster_;
  RouterMetrics* const metrics_;
  RetryBudget retry_budget_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<hlem::v1::ServingNode::StubInterface>> stubs_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint32_t> in_flight_{0};
};

hlem::v1::RoutingReason ToProto(Reason reason);

}  // namespace hlem::router
