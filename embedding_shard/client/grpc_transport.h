#pragma once
// ShardTransport over gRPC Lookup (the fallback data plane, and what tools use). One channel per
// server; calls are asynchronous so a batch spread over several servers is read in parallel.
// Thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "common/grpc_security.h"
#include "embedding_shard/core/shard_client.h"
#include "hlem/v1/embedding_shard.grpc.pb.h"

namespace hlem::shard {

class GrpcShardTransport final : public ShardTransport {
 public:
  explicit GrpcShardTransport(const std::vector<std::string>& addresses, const TlsConfig& tls = {},
                              int max_message_bytes = 256 << 20);

  std::string name() const override { return "grpc"; }
  uint32_t num_servers() const override { return static_cast<uint32_t>(stubs_.size()); }
  absl::StatusOr<std::unique_ptr<Pending>> Start(uint32_t server, const TableSpec& spec,
                                                 const ReadBatch& batch,
                                                 absl::Time deadline) override;
  absl::Status Finish(Pending& pending, absl::Time deadline) override;
  absl::Status Probe(uint32_t server, absl::Time deadline) override;
  absl::Status Reconnect(uint32_t /*server*/) override { return absl::OkStatus(); }

  hlem::v1::EmbeddingShard::Stub& stub(uint32_t server) { return *stubs_[server]; }

 private:
  std::vector<std::unique_ptr<hlem::v1::EmbeddingShard::Stub>> stubs_;
};

}  // namespace hlem::shard
