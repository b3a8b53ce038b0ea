#include "router/service/node_links.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "grpcpp/client_context.h"

namespace hlem::router {

namespace v1 = ::hlem::v1;

absl::StatusOr<v1::NodeInfo> FetchNodeInfo(v1::ServingNode::StubInterface& stub,
                                           absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(ctx, absl::Now() + timeout);
  v1::NodeInfo info;
  const grpc::Status st = stub.GetNodeInfo(&ctx, v1::GetNodeInfoRequest(), &info);
  if (!st.ok()) return FromGrpcStatus(st);
  return info;
}

std::vector<FeatureShards> FeaturesOf(const v1::NodeInfo& info) {
  std::vector<FeatureShards> out;
  for (const v1::FeatureTable& t : info.feature_tables()) {
    out.push_back({t.table_id(), t.residency_shard_rows(), t.rows()});
  }
  return out;
}

NodeLinks::~NodeLinks() {
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [address, link] : links_) addresses.push_back(address);
  }
  for (const std::string& address : addresses) Leave(address);
}

absl::Status NodeLinks::Join(const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    if (links_.contains(address)) return absl::OkStatus();
  }
  std::shared_ptr<v1::ServingNode::Stub> stub =
      v1::ServingNode::NewStub(MakeChannel(address, node_channel_));
  absl::StatusOr<v1::NodeInfo> info = FetchNodeInfo(*stub, info_timeout_);
  if (!info.ok()) {
    return absl::UnavailableError(
        absl::StrCat("node ", address, ": GetNodeInfo: ", info.status().message()));
  }
  const std::vector<FeatureShards> features = FeaturesOf(*info);
  const std::vector<FeatureShards>& want = cluster_.options().features;
  bool same = features.size() == want.size();
  for (size_t f = 0; same && f < features.size(); ++f) {
    same = features[f].table_id == want[f].table_id &&
           features[f].residency_shard_rows == want[f].residency_shard_rows &&
           features[f].rows == want[f].rows;
  }
  if (!same) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", address, " (", info->node_id(), ") has other feature tables than the cluster"));
  }
  absl::StatusOr<int> index = cluster_.AddNode(info->node_id(), address);
  if (!index.ok()) {
    return absl::Status(index.status().code(),
                        absl::StrCat("node ", address, ": ", index.status().message()));
  }
  auto link = std::make_unique<Link>();
  link->index = *index;
  link->id = info->node_id();
  const std::string host = address.substr(0, address.rfind(':'));
  auto admin = v1::ServingNodeAdmin::NewStub(
      MakeChannel(absl::StrCat(host, ":", info->admin_port()), admin_channel_));
  link->feed = std::make_unique<GrpcResidencyFeed>(
      stub, std::shared_ptr<v1::ServingNodeAdmin::Stub>(std::move(admin)), "router");
  link->sync = std::make_unique<ResidencySync>(cluster_, link->index, *link->feed, clock_);
  service_.SetNodeStub(link->index, stub);
  Link* l = link.get();
  link->thread = std::thread([l] { l->sync->Run(); });
  GetLogger("router")->info("node_joined id={} address={} admin_port={} epoch={}", info->node_id(),
                            address, info->admin_port(), info->incarnation_epoch());
  absl::MutexLock lock(&mu_);
  links_[address] = std::move(link);
  return absl::OkStatus();
}

void NodeLinks::Leave(const std::string& address) {
  std::unique_ptr<Link> link;
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(address);
    if (it == links_.end()) return;
    link = std::move(it->second);
    links_.erase(it);
  }
  link->sync->Stop();
  link->thread.join();
  service_.SetNodeStub(link->index, nullptr);
  cluster_.RemoveNode(link->index);
  GetLogger("router")->info("node_left id={} address={}", link->id, address);
}

size_t NodeLinks::size() const {
  absl::MutexLock lock(&mu_);
  return links_.size();
}

}  // namespace hlem::router
