#pragma once
// The router's connections to its serving nodes as they join and leave (the Membership listener,
// common/membership.h). A join asks the node for its GetNodeInfo (id, admin port, feature tables,
// which must match the cluster's), adds it to the Cluster, gives the service its stub and starts a
// residency subscription thread (ResidencySync over GrpcResidencyFeed); a leave stops the
// subscription, takes the stub away and removes the node from the Cluster, so its users are routed
// elsewhere at once. Thread-safe.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "hlem/v1/serving_node.grpc.pb.h"
#include "router/core/cluster.h"
#include "router/core/residency_sync.h"
#include "router/service/grpc_feed.h"
#include "router/service/router_service.h"

namespace hlem::router {

// The node's GetNodeInfo, within `timeout`.
absl::StatusOr<hlem::v1::NodeInfo> FetchNodeInfo(hlem::v1::ServingNode::StubInterface& stub,
                                                 absl::Duration timeout);
// The node's feature tables (table id, residency shard size, rows), in feature order.
std::vector<FeatureShards> FeaturesOf(const hlem::v1::NodeInfo& info);

class NodeLinks {
 public:
  // Borrows everything. `node_channel`: TLS of the channels to the nodes' serving and admin
  // ports; the admin channel also carries `admin_token` (may be null).
  NodeLinks(Cluster& cluster, RouterServiceImpl& service, Clock& clock,
            ChannelOptions node_channel = {}, std::shared_ptr<const TokenFile> admin_token = {},
            absl::Duration info_timeout = absl::Seconds(5))
      : cluster_(cluster),
        service_(service),
        clock_(clock),
        node_channel_(std::move(node_channel)),
        admin_channel_{.max_message_bytes = node_channel_.max_message_bytes,
                       .tls = node_channel_.tls,
                       .token = std::move(admin_token)},
        info_timeout_(info_timeout) {}
  ~NodeLinks();  // every node leaves

  // UNAVAILABLE when the node does not answer GetNodeInfo, FAILED_PRECONDITION when its feature
  // tables are not the cluster's, ALREADY_EXISTS when its id is in the cluster under another
  // address, RESOURCE_EXHAUSTED when the cluster is full. A known address is OK (nothing to do).
  absl::Status Join(const std::string& address);
  void Leave(const std::string& address);
  size_t size() const;

 private:
  struct Link {
    int index = -1;
    std::string id;
    std::unique_ptr<GrpcResidencyFeed> feed;
    std::unique_ptr<ResidencySync> sync;
    std::thread thread;
  };
  Cluster& cluster_;
  RouterServiceImpl& service_;
  Clock& clock_;
  const ChannelOptions node_channel_, admin_channel_;
  const absl::Duration info_timeout_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::router
