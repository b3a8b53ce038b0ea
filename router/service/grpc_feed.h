#pragma once
// ResidencyFeed over a serving node's gRPC API: StreamResidency on the serving port, Snapshot on
// the admin port. Converts the protos to the node's own ResidencyEvent type.

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "hlem/v1/serving_node.grpc.pb.h"
#include "router/core/residency_sync.h"

namespace hlem::router {

// Proto → core conversions (the inverse of serving_node/service's ToProto).
serving::ResidencyEvent FromProto(const hlem::v1::ResidencyEvent& e);

class GrpcResidencyFeed final : public ResidencyFeed {
 public:
  GrpcResidencyFeed(std::shared_ptr<hlem::v1::ServingNode::StubInterface> node,
                    std::shared_ptr<hlem::v1::ServingNodeAdmin::StubInterface> admin,
                    std::string subscriber)
      : node_(std::move(node)), admin_(std::move(admin)), subscriber_(std::move(subscriber)) {}

  absl::Status Stream(
      uint64_t epoch, uint64_t from_seq,
      const std::function<bool(uint64_t, const std::vector<serving::ResidencyEvent>&)>& on_batch)
      override;
  absl::StatusOr<serving::ResidencySnapshot> Snapshot() override;
  // Ends the call in progress (a stream, or a snapshot of up to 30 s) and refuses the next ones.
  void Cancel() override;

 private:
  // Makes `ctx` the call Cancel ends while it is in scope; CANCELLED when Cancel came first.
  absl::Status Register(grpc::ClientContext* ctx);
  void Unregister();

  std::shared_ptr<hlem::v1::ServingNode::StubInterface> node_;
  std::shared_ptr<hlem::v1::ServingNodeAdmin::StubInterface> admin_;
  const std::string subscriber_;
  absl::Mutex mu_;
  grpc::ClientContext* active_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hlem::router
