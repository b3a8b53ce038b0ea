#pragma once
// The allocator's NodeApi over gRPC (allocator_service/core/allocator.h): GetState on a node's
// serving port, SetAlpha on its admin port, both with the callback API so a round has every node's
// call in flight at once. One channel per address, kept. Thread-safe.

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "allocator_service/core/allocator.h"
#include "common/grpc_server.h"
#include "hlem/v1/serving_node.grpc.pb.h"

namespace hlem::allocator {

// A node's WindowStats as the controllers read it.
WindowState FromProto(const hlem::v1::WindowStats& w);

class GrpcNodeApi final : public NodeApi {
 public:
  // `serving`: the channels to the nodes' serving ports; `admin`: to their admin ports (with the
  // admin token).
  explicit GrpcNodeApi(uint32_t max_windows = 16, ChannelOptions serving = {},
                       ChannelOptions admin = {})
      : max_windows_(max_windows),
        serving_channel_(std::move(serving)),
        admin_channel_(std::move(admin)) {}
  void GetState(const std::string& address, absl::Duration timeout,
                std::function<void(absl::StatusOr<State>)> done) override;
  void SetAlpha(const std::string& admin_address, const Push& push, absl::Duration timeout,
                std::function<void(absl::StatusOr<Applied>)> done) override;

 private:
  hlem::v1::ServingNode::Stub& Serving(const std::string& address);
  hlem::v1::ServingNodeAdmin::Stub& Admin(const std::string& address);
  const uint32_t max_windows_;
  const ChannelOptions serving_channel_, admin_channel_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<hlem::v1::ServingNode::Stub>> serving_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<hlem::v1::ServingNodeAdmin::Stub>> admin_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::allocator
