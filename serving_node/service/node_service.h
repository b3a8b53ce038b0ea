#pragma once
// The gRPC shell of the serving node (protos/hlem/v1/serving_node.proto): proto <-> Node, one
// status mapping. ServingNode on the serving port (Infer, GetState, GetNodeInfo, StreamResidency),
// ServingNodeAdmin on the admin port (SetAlpha, Drain, Snapshot). No logic of its own beyond
// request shape checks. Thread-safe.

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc_security.h"
#include "hlem/v1/serving_node.grpc.pb.h"
#include "serving_node/core/node.h"
#include "serving_node/core/pipeline.h"

namespace hlem::serving {

// The static part of NodeInfo that the node core does not know.
struct NodeDescription {
  std::string device = "cpu";
  std::string device_name;
  std::string model_name;
  uint32_t model_layers = 0;
  uint32_t model_dim = 0;
  uint64_t page_tokens = 0;
  struct Table {
    uint32_t table_id = 0;
    std::string name;
    uint64_t rows = 0;
    uint32_t dim = 0;
  };
  std::vector<Table> tables;  // in feature order
  uint64_t residency_shard_rows = 0;
};

// The request's events and candidates as the pipeline takes them. INVALID_ARGUMENT naming the
// field (e.g. "history[3].feature_ids: 2 ids; the model has 3 feature tables"), also for more
// events or candidates than `options` allow (checked before anything is copied).
absl::StatusOr<InferInput> InferInputFromProto(const hlem::v1::InferRequest& request,
                                               const PipelineOptions& options, absl::Time deadline);

class ServingNodeServiceImpl final : public hlem::v1::ServingNode::Service {
 public:
  // Residency streams open at once at most, by default: each holds one of the server's handler
  // threads for its lifetime, and the subscribers are the routers and allocators (a few).
  static constexpr uint32_t kDefaultMaxStreams = 32;

  // Borrows the node, which must outlive the service. Beyond `max_streams` open residency
  // streams a new one is refused with RESOURCE_EXHAUSTED, so idle subscribers cannot take the
  // threads Infer needs.
  ServingNodeServiceImpl(Node& node, NodeDescription description,
                         uint32_t max_streams = kDefaultMaxStreams)
      : node_(node), description_(std::move(description)), max_streams_(max_streams) {}

  grpc::Status Infer(grpc::ServerContext* context, const hlem::v1::InferRequest* request,
                     hlem::v1::InferResponse* response) override;
  grpc::Status GetState(grpc::ServerContext* context, const hlem::v1::GetStateRequest* request,
                        hlem::v1::GetStateResponse* response) override;
  grpc::Status GetNodeInfo(grpc::ServerContext* context,
                           const hlem::v1::GetNodeInfoRequest* request,
                           hlem::v1::NodeInfo* response) override;
  grpc::Status StreamResidency(
      grpc::ServerContext* context, const hlem::v1::StreamResidencyRequest* request,
      grpc::ServerWriter<hlem::v1::StreamResidencyResponse>* writer) override;

  // Ends open residency streams (UNAVAILABLE) and refuses new ones; call before the server's
  // shutdown so it does not wait for them.
  void Stop() { stopping_ = true; }
  // The admin port, once the server has bound it (NodeInfo.admin_port).
  void SetAdminPort(uint32_t port) { admin_port_ = port; }

 private:
  Node& node_;
  const NodeDescription description_;
  const uint32_t max_streams_;
  std::atomic<uint32_t> admin_port_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<uint32_t> open_streams_{0};
};

class ServingNodeAdminImpl final : public hlem::v1::ServingNodeAdmin::Service {
 public:
  // `token` (may be null: no check): every call needs 'authorization: Bearer <token>'.
  explicit ServingNodeAdminImpl(Node& node, const TokenFile* token = nullptr)
      : node_(node), token_(token) {}

  grpc::Status SetAlpha(grpc::ServerContext* context, const hlem::v1::SetAlphaRequest* request,
                        hlem::v1::SetAlphaResponse* response) override;
  grpc::Status Drain(grpc::ServerContext* context, const hlem::v1::DrainRequest* request,
                     hlem::v1::DrainResponse* response) override;
  grpc::Status Snapshot(grpc::ServerContext* context, const hlem::v1::SnapshotRequest* request,
                        grpc::ServerWriter<hlem::v1::SnapshotChunk>* writer) override;

 private:
  grpc::Status Authorize(const grpc::ServerContext& context) const {
    return CheckBearerToken(context, token_, "hlem.v1.ServingNodeAdmin");
  }
  Node& node_;
  const TokenFile* token_;
};

// Conversions shared with clients and tools.
void ToProto(const NodeWindow& w, hlem::v1::WindowStats* out);
void ToProto(const ResidencyEvent& e, hlem::v1::ResidencyEvent* out);

}  // namespace hlem::serving
