#include "embedding_shard/client/grpc_transport.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"

namespace hlem::shard {
namespace {

class GrpcPending final : public ShardTransport::Pending {
 public:
  grpc::ClientContext context;
  hlem::v1::LookupRequest request;
  hlem::v1::LookupResponse response;
  grpc::Status status;
  absl::Notification done;
  uint32_t server = 0;
  size_t row_bytes = 0;
  std::span<std::byte* const> dst;
};

}  // namespace

GrpcShardTransport::GrpcShardTransport(const std::vector<std::string>& addresses,
                                       const TlsConfig& tls, int max_message_bytes) {
  const ChannelOptions channel{.max_message_bytes = max_message_bytes, .tls = tls};
  for (const std::string& address : addresses) {
    stubs_.push_back(hlem::v1::EmbeddingShard::NewStub(MakeChannel(address, channel)));
  }
}

absl::StatusOr<std::unique_ptr<ShardTransport::Pending>> GrpcShardTransport::Start(
    uint32_t server, const TableSpec& spec, const ReadBatch& batch, absl::Time deadline) {
  if (server >= stubs_.size()) return absl::InvalidArgumentError("no such shard");
  auto pending = std::make_unique<GrpcPending>();
  pending->server = server;
  pending->row_bytes = spec.row_bytes();
  pending->dst = batch.dst;
  pending->request.set_table_id(spec.id);
  pending->request.mutable_row_ids()->Add(batch.rows.begin(), batch.rows.end());
  SetDeadline(pending->context, deadline);
  GrpcPending* p = pending.get();
  stubs_[server]->async()->Lookup(&p->context, &p->request, &p->response, [p](grpc::Status status) {
    p->status = std::move(status);
    p->done.Notify();
  });
  return pending;
}

absl::Status GrpcShardTransport::Finish(Pending& base, absl::Time deadline) {
  auto& p = static_cast<GrpcPending&>(base);
  // The call carries the deadline itself; the extra second only guards against a lost callback.
  if (!p.done.WaitForNotificationWithDeadline(deadline + absl::Seconds(1))) {
    p.context.TryCancel();
    p.done.WaitForNotification();
  }
  if (!p.status.ok()) {
    absl::Status s = FromGrpcStatus(p.status);
    return absl::Status(s.code(), absl::StrCat("shard ", p.server, ": ", s.message()));
  }
  const std::string& bytes = p.response.rows();
  if (p.response.row_bytes() != p.row_bytes || bytes.size() != p.dst.size() * p.row_bytes) {
    return absl::InternalError(absl::StrCat("shard ", p.server, ": Lookup returned ", bytes.size(),
                                            " bytes of ", p.response.row_bytes(), "-byte rows for ",
                                            p.dst.size(), " rows of ", p.row_bytes, " bytes"));
  }
  for (size_t i = 0; i < p.dst.size(); ++i) {
    std::memcpy(p.dst[i], bytes.data() + i * p.row_bytes, p.row_bytes);
  }
  return absl::OkStatus();
}

absl::Status GrpcShardTransport::Probe(uint32_t server, absl::Time deadline) {
  if (server >= stubs_.size()) return absl::InvalidArgumentError("no such shard");
  grpc::ClientContext context;
  SetDeadline(context, deadline);
  hlem::v1::GetShardInfoRequest request;
  hlem::v1::ShardInfo info;
  return FromGrpcStatus(stubs_[server]->GetShardInfo(&context, request, &info));
}

}  // namespace hlem::shard
