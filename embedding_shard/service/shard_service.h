#pragma once
// The gRPC shell of the embedding shard: proto <-> ShardStore, one status mapping, per-RPC
// metrics. Holds no logic of its own. Thread-safe (the store is read-only).

#include <cstdint>
#include <optional>

#include "embedding_shard/core/shard_store.h"
#include "embedding_shard/service/shard_metrics.h"
#include "embedding_shard/transport/ucx_common.h"
#include "hlem/v1/embedding_shard.grpc.pb.h"

namespace hlem::shard {

class ShardServiceImpl final : public hlem::v1::EmbeddingShard::Service {
 public:
  // `rdma` is null when the UCX data plane is disabled (GetRdmaInfo then answers UNAVAILABLE).
  ShardServiceImpl(const ShardStore& store, const RdmaServerInfo* rdma, uint64_t incarnation,
                   ShardMetrics& metrics)
      : store_(store), rdma_(rdma), incarnation_(incarnation), metrics_(metrics) {}

  grpc::Status Lookup(grpc::ServerContext* context, const hlem::v1::LookupRequest* request,
                      hlem::v1::LookupResponse* response) override;
  grpc::Status GetShardInfo(grpc::ServerContext* context,
                            const hlem::v1::GetShardInfoRequest* request,
                            hlem::v1::ShardInfo* response) override;
  grpc::Status GetRdmaInfo(grpc::ServerContext* context,
                           const hlem::v1::GetRdmaInfoRequest* request,
                           hlem::v1::RdmaInfo* response) override;

 private:
  const ShardStore& store_;
  const RdmaServerInfo* rdma_;
  const uint64_t incarnation_;
  ShardMetrics& metrics_;
};

hlem::v1::Dtype ToProto(Dtype dtype);
std::optional<Dtype> FromProto(hlem::v1::Dtype dtype);

}  // namespace hlem::shard
