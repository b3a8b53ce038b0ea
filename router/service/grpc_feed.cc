#include "router/service/grpc_feed.h"

#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "common/grpc_status.h"

namespace hlem::router {

namespace v1 = ::hlem::v1;
using serving::ResidencyEvent;

serving::ResidencyEvent FromProto(const v1::ResidencyEvent& p) {
  ResidencyEvent e;
  e.epoch = p.epoch();
  e.seq = p.seq();
  switch (p.kind_case()) {
    case v1::ResidencyEvent::kKvStored:
      e.kind = ResidencyEvent::Kind::kKvStored;
      e.user_id = p.kv_stored().user_id();
      e.tokens = p.kv_stored().cached_tokens();
      break;
    case v1::ResidencyEvent::kKvEvicted:
      e.kind = p.kv_evicted().remaining_tokens() > 0 ? ResidencyEvent::Kind::kKvTruncated
                                                     : ResidencyEvent::Kind::kKvEvicted;
      e.user_id = p.kv_evicted().user_id();
      e.tokens = p.kv_evicted().remaining_tokens();
      break;
    case v1::ResidencyEvent::kEmbShardResident:
      e.kind = ResidencyEvent::Kind::kEmbShardResident;
      e.table_id = p.emb_shard_resident().shard().table_id();
      e.shard = p.emb_shard_resident().shard().residency_shard_id();
      break;
    case v1::ResidencyEvent::kEmbShardNonResident:
      e.kind = ResidencyEvent::Kind::kEmbShardEvicted;
      e.table_id = p.emb_shard_non_resident().shard().table_id();
      e.shard = p.emb_shard_non_resident().shard().residency_shard_id();
      break;
    case v1::ResidencyEvent::kLoadReport:
    case v1::ResidencyEvent::KIND_NOT_SET:
      e.kind = ResidencyEvent::Kind::kLoadReport;
      e.load = {.load = p.load_report().load(),
                .queue_depth = p.load_report().queue_depth(),
                .in_flight_tokens = p.load_report().in_flight_tokens(),
                .draining = p.load_report().draining(),
                .alpha_effective = p.load_report().alpha_effective()};
      break;
  }
  return e;
}

absl::Status GrpcResidencyFeed::Stream(
    uint64_t epoch, uint64_t from_seq,
    const std::function<bool(uint64_t, const std::vector<ResidencyEvent>&)>& on_batch) {
  grpc::ClientContext ctx;
  if (absl::Status st = Register(&ctx); !st.ok()) return st;
  absl::Cleanup unregister = [this] { Unregister(); };
  v1::StreamResidencyRequest req;
  req.set_epoch(epoch);
  req.set_from_seq(from_seq);
  req.set_subscriber(subscriber_);
  auto reader = node_->StreamResidency(&ctx, req);
  v1::StreamResidencyResponse msg;
  std::vector<ResidencyEvent> batch;
  bool stopped = false;
  while (reader->Read(&msg)) {
    batch.clear();
    for (const v1::ResidencyEvent& e : msg.events()) batch.push_back(FromProto(e));
    if (!on_batch(msg.epoch(), batch)) {
      stopped = true;
      ctx.TryCancel();
      break;
    }
  }
  if (stopped) {
    while (reader->Read(&msg)) {
    }
  }
  const grpc::Status st = reader->Finish();
  if (stopped || st.error_code() == grpc::StatusCode::CANCELLED) return absl::OkStatus();
  return FromGrpcStatus(st);
}

absl::StatusOr<serving::ResidencySnapshot> GrpcResidencyFeed::Snapshot() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  // Cancellable: a node dropped (NodeLinks::Leave) while its snapshot streams must not hold the
  // membership poll, which waits for its link's thread, for the snapshot's 30 s.
  if (absl::Status st = Register(&ctx); !st.ok()) return st;
  absl::Cleanup unregister = [this] { Unregister(); };
  auto reader = admin_->Snapshot(&ctx, v1::SnapshotRequest());
  serving::ResidencySnapshot s;
  v1::SnapshotChunk chunk;
  bool first = true;
  while (reader->Read(&chunk)) {
    if (first) {
      s.epoch = chunk.epoch();
      s.seq = chunk.seq();
      s.load = {.load = chunk.load().load(),
                .queue_depth = chunk.load().queue_depth(),
                .in_flight_tokens = chunk.load().in_flight_tokens(),
                .draining = chunk.load().draining(),
                .alpha_effective = chunk.load().alpha_effective()};
      first = false;
    }
    for (const v1::ResidentUser& u : chunk.users())
      s.users.push_back({u.user_id(), u.cached_tokens()});
    for (const v1::ResidencyShardRef& r : chunk.resident_shards()) {
      s.shards.push_back({r.table_id(), r.residency_shard_id()});
    }
  }
  const grpc::Status st = reader->Finish();
  if (!st.ok()) return FromGrpcStatus(st);
  if (first) return absl::InternalError("snapshot: no chunk");
  return s;
}

absl::Status GrpcResidencyFeed::Register(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("feed cancelled");
  active_ = ctx;
  return absl::OkStatus();
}

void GrpcResidencyFeed::Unregister() {
  absl::MutexLock lock(&mu_);
  active_ = nullptr;
}

void GrpcResidencyFeed::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (active_ != nullptr) active_->TryCancel();
}

}  // namespace hlem::router
