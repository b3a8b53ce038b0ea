#pragma once
// The serving node's RowSource in production: the embedding-shard client (UCX or gRPC reads with
// replica failover). The pipeline fetches a request's missed rows through it, one call per table.

#include "embedding_shard/core/shard_client.h"
#include "serving_node/core/row_source.h"

namespace hlem::serving {

class ShardRowSource final : public RowSource {
 public:
  // Borrows the client, which must outlive this source.
  explicit ShardRowSource(shard::ShardClient& client) : client_(client) {}
  absl::Status Fetch(uint32_t table_id, std::span<const uint64_t> rows, std::span<std::byte> out,
                     absl::Time deadline) override {
    return client_.Fetch(table_id, rows, out, deadline);
  }

 private:
  shard::ShardClient& client_;
};

}  // namespace hlem::serving
