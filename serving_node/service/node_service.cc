#include "serving_node/service/node_service.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/feature_ids_proto.h"
#include "common/grpc_status.h"
#include "common/shed.h"

namespace hlem::serving {
namespace {

namespace v1 = ::hlem::v1;

// A residency stream wakes this often to notice a cancelled call or a stopping server.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(200);
// Events per StreamResidency message and users per Snapshot chunk.
constexpr size_t kEventsPerMessage = 4096;
constexpr size_t kUsersPerChunk = 16384;

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t ns = absl::ToUnixNanos(t);
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

v1::KvEvictionCause CauseToProto(ResidencyEvent::Cause cause) {
  switch (cause) {
    case ResidencyEvent::Cause::kLru:
      return v1::KV_EVICTION_CAUSE_LRU;
    case ResidencyEvent::Cause::kAlpha:
      return v1::KV_EVICTION_CAUSE_ALPHA;
    case ResidencyEvent::Cause::kMismatch:
      return v1::KV_EVICTION_CAUSE_MISMATCH;
    default:
      return v1::KV_EVICTION_CAUSE_UNSPECIFIED;
  }
}

void LoadToProto(const ResidencyEvent::Load& l, v1::LoadReport* out) {
  out->set_load(l.load);
  out->set_queue_depth(l.queue_depth);
  out->set_in_flight_tokens(l.in_flight_tokens);
  out->set_draining(l.draining);
  out->set_alpha_effective(l.alpha_effective);
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

absl::StatusOr<InferInput> InferInputFromProto(const v1::InferRequest& request,
                                               const PipelineOptions& options,
                                               absl::Time deadline) {
  const size_t features = options.features.size();
  if (absl::Status st =
          CheckRequestCounts(options, request.history_size(), request.candidates_size());
      !st.ok()) {
    return st;
  }
  InferInput in;
  in.user = request.user_id();
  in.expected_kv_resident = request.expected_kv_resident();
  in.deadline = deadline;
  if (absl::Status st = AppendFeatureIds(request.history(), features, "history", &in.history);
      !st.ok()) {
    return st;
  }
  if (absl::Status st =
          AppendFeatureIds(request.candidates(), features, "candidates", &in.candidates);
      !st.ok()) {
    return st;
  }
  if (request.has_delta() && request.delta().length() > 0) {
    in.delta = ClientPrefix{.len = request.delta().length(), .hash = request.delta().hash()};
  }
  return in;
}

grpc::Status ServingNodeServiceImpl::Infer(grpc::ServerContext* context,
                                           const v1::InferRequest* request,
                                           v1::InferResponse* response) {
  const absl::Time received = absl::Now();
  absl::StatusOr<InferInput> in =
      InferInputFromProto(*request, node_.parts().pipeline->options(), DeadlineOf(*context));
  if (!in.ok()) return ToGrpcStatus(in.status());
  absl::StatusOr<InferOutput> out = node_.InferSync(std::move(*in));
  if (!out.ok()) {
    // The router retries a shed request elsewhere unless it was shed late (common/shed.h).
    if (IsShedLate(out.status())) context->AddTrailingMetadata(kShedMetadataKey, kShedLateValue);
    return ToGrpcStatus(out.status());
  }
  const absl::Duration total = absl::Now() - received;
  response->mutable_scores()->Assign(out->scores.begin(), out->scores.end());
  response->set_num_tasks(out->targets);
  response->set_cached_prefix_tokens(out->cached_prefix_tokens);
  response->set_computed_tokens(out->computed_tokens);
  response->set_history_tokens(out->history_tokens);
  response->set_trimmed_events(out->trimmed_events);
  response->set_emb_hits(out->emb_hits);
  response->set_emb_misses(out->emb_misses);
  response->set_stale_kv_hit(out->stale_kv_hit);
  response->mutable_next_prefix()->set_length(static_cast<uint32_t>(out->next_prefix.len));
  response->mutable_next_prefix()->set_hash(out->next_prefix.hash);
  response->set_node_id(node_.options().node_id);
  response->set_incarnation_epoch(node_.epoch());
  v1::InferTimings* t = response->mutable_timings();
  const absl::Duration lookup = out->emb_seconds - out->fetch_seconds - out->copy_seconds;
  t->set_emb_lookup_seconds(Seconds(std::max(lookup, absl::ZeroDuration())));
  t->set_emb_fetch_seconds(Seconds(out->fetch_seconds));
  t->set_copy_seconds(Seconds(out->copy_seconds));
  t->set_compute_seconds(Seconds(out->compute_seconds));
  t->set_kv_append_seconds(Seconds(out->kv_seconds));
  t->set_total_seconds(Seconds(total));
  // What is left: waiting in the queue (and for the batch's other requests).
  const absl::Duration accounted = out->emb_seconds + out->compute_seconds + out->kv_seconds;
  t->set_queue_seconds(Seconds(std::max(total - accounted, absl::ZeroDuration())));
  return grpc::Status::OK;
}

void ToProto(const NodeWindow& w, v1::WindowStats* out) {
  out->set_window_index(w.index);
  SetTimestamp(w.start, out->mutable_window_start());
  out->set_window_duration_seconds(Seconds(w.duration));
  out->set_requests(w.requests);
  out->set_hot_user_ratio(w.hot_user_ratio);
  out->set_kv_hit_rate(w.kv_hit_rate);
  out->set_kv_user_hit_rate(w.kv_user_hit_rate);
  out->set_emb_hit_rate(w.emb_hit_rate);
  out->set_mean_seq_len_norm(w.mean_seq_len_norm);
  out->set_mean_seq_len_tokens(w.mean_seq_len_tokens);
  out->set_slo_violation_fraction(w.slo_violation_fraction);
  out->set_stale_hit_rate(w.stale_hit_rate);
  out->set_hot_window_count(w.hot_window_count);
  out->set_max_history_tokens(w.max_history_tokens);
  out->set_alpha_target(w.alpha_target);
  out->set_alpha_effective(w.alpha_effective);
  out->set_p50_seconds(w.p50_seconds);
  out->set_p99_seconds(w.p99_seconds);
  out->set_p99_norm(w.p99_norm);
  out->set_slo_seconds(w.slo_seconds);
  out->set_p99_norm_cap(w.p99_norm_cap);
  out->set_load(w.load);
  out->set_queue_depth(w.queue_depth);
  out->set_in_flight_tokens(w.in_flight_tokens);
  out->set_mean_load(w.mean_load);
  out->set_pool_bytes(w.pool_bytes);
  out->set_kv_bytes(w.kv_bytes);
  out->set_emb_bytes(w.emb_bytes);
  out->set_free_bytes(w.free_bytes);
  out->set_refill_bytes(w.refill_bytes);
  out->set_refill_backlog_bytes(w.refill_backlog_bytes);
  out->set_emb_miss_bytes(w.emb_miss_bytes);
  out->set_shard_fetch_bytes(w.shard_fetch_bytes);
  out->set_link_utilization_ratio(w.link_utilization_ratio);
  out->set_link_bytes_per_second(w.link_bytes_per_second);
}

void ToProto(const ResidencyEvent& e, v1::ResidencyEvent* out) {
  out->set_epoch(e.epoch);
  out->set_seq(e.seq);
  switch (e.kind) {
    case ResidencyEvent::Kind::kKvStored: {
      v1::KvStored* s = out->mutable_kv_stored();
      s->set_user_id(e.user_id);
      s->set_cached_tokens(static_cast<uint32_t>(e.tokens));
      break;
    }
    case ResidencyEvent::Kind::kKvEvicted:
    case ResidencyEvent::Kind::kKvTruncated: {
      v1::KvEvicted* s = out->mutable_kv_evicted();
      s->set_user_id(e.user_id);
      s->set_remaining_tokens(
          e.kind == ResidencyEvent::Kind::kKvEvicted ? 0 : static_cast<uint32_t>(e.tokens));
      s->set_cause(CauseToProto(e.cause));
      break;
    }
    case ResidencyEvent::Kind::kEmbShardResident: {
      v1::ResidencyShardRef* s = out->mutable_emb_shard_resident()->mutable_shard();
      s->set_table_id(e.table_id);
      s->set_residency_shard_id(e.shard);
      break;
    }
    case ResidencyEvent::Kind::kEmbShardEvicted: {
      v1::ResidencyShardRef* s = out->mutable_emb_shard_non_resident()->mutable_shard();
      s->set_table_id(e.table_id);
      s->set_residency_shard_id(e.shard);
      break;
    }
    case ResidencyEvent::Kind::kLoadReport:
      LoadToProto(e.load, out->mutable_load_report());
      break;
  }
}

grpc::Status ServingNodeServiceImpl::GetState(grpc::ServerContext*,
                                              const v1::GetStateRequest* request,
                                              v1::GetStateResponse* response) {
  response->set_node_id(node_.options().node_id);
  response->set_incarnation_epoch(node_.epoch());
  for (const NodeWindow& w : node_.Windows(request->max_windows())) {
    ToProto(w, response->add_windows());
  }
  const NodeGaugesNow g = node_.Gauges();
  v1::NodeGauges* c = response->mutable_current();
  c->set_load(g.load);
  c->set_queue_depth(g.queue_depth);
  c->set_in_flight_tokens(g.in_flight_tokens);
  c->set_draining(g.draining);
  c->set_alpha_target(g.alpha_target);
  c->set_alpha_effective(g.alpha_effective);
  c->set_alpha_epoch(g.alpha_epoch);
  c->set_alpha_decision_id(g.alpha_decision_id);
  c->set_pool_bytes(g.pool_bytes);
  c->set_page_bytes(g.page_bytes);
  c->set_kv_bytes(g.kv_bytes);
  c->set_emb_bytes(g.emb_bytes);
  c->set_free_bytes(g.free_bytes);
  c->set_kv_resident_users(g.kv_resident_users);
  c->set_emb_resident_rows(g.emb_resident_rows);
  c->set_refill_backlog_bytes(g.refill_backlog_bytes);
  return grpc::Status::OK;
}

grpc::Status ServingNodeServiceImpl::GetNodeInfo(grpc::ServerContext*,
                                                 const v1::GetNodeInfoRequest*,
                                                 v1::NodeInfo* response) {
  const NodeOptions& o = node_.options();
  const PipelineOptions& p = node_.parts().pipeline->options();
  response->set_node_id(o.node_id);
  response->set_incarnation_epoch(node_.epoch());
  response->set_device(description_.device);
  response->set_device_name(description_.device_name);
  response->set_admin_port(admin_port_);
  for (size_t f = 0; f < description_.tables.size(); ++f) {
    const NodeDescription::Table& t = description_.tables[f];
    v1::FeatureTable* out = response->add_feature_tables();
    out->set_index(static_cast<uint32_t>(f));
    out->set_table_id(t.table_id);
    out->set_name(t.name);
    out->set_rows(t.rows);
    out->set_dim(t.dim);
    out->set_dtype(v1::DTYPE_FP32);
    out->set_residency_shard_rows(description_.residency_shard_rows);
  }
  response->set_max_history_tokens(p.max_history);
  response->set_max_candidates(p.max_candidates);
  response->set_num_tasks(node_.parts().pipeline->targets());
  response->set_model_name(description_.model_name);
  response->set_model_layers(description_.model_layers);
  response->set_model_dim(description_.model_dim);
  response->set_slo_seconds(Seconds(o.slo));
  response->set_window_duration_seconds(Seconds(o.window));
  const NodeGaugesNow g = node_.Gauges();
  response->set_pool_bytes(g.pool_bytes);
  response->set_page_bytes(g.page_bytes);
  response->set_page_tokens(static_cast<uint32_t>(description_.page_tokens));
  response->set_load_report_interval_seconds(Seconds(o.load_report_interval));
  return grpc::Status::OK;
}

grpc::Status ServingNodeServiceImpl::StreamResidency(
    grpc::ServerContext* context, const v1::StreamResidencyRequest* request,
    grpc::ServerWriter<v1::StreamResidencyResponse>* writer) {
  // Counted from here to every return; over the cap the stream is refused at once.
  const uint32_t open = open_streams_.fetch_add(1) + 1;
  const absl::Cleanup close = [this] { open_streams_.fetch_sub(1); };
  if (open > max_streams_) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("residency streams: ", max_streams_,
                                     " are open, the node's limit; retry later"));
  }
  ResidencyEventLog& log = *node_.parts().events;
  if (request->epoch() != 0 && request->epoch() != log.epoch()) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("epoch ", request->epoch(), " is not the node's current epoch ", log.epoch(),
                     "; take a Snapshot"));
  }
  uint64_t next = request->from_seq() == 0 ? log.last_seq() + 1 : request->from_seq();
  bool first = true;
  while (true) {
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "node stopping");
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    absl::StatusOr<std::vector<ResidencyEvent>> events = log.Since(next);
    if (!events.ok()) return ToGrpcStatus(events.status());
    const uint64_t last = log.last_seq();
    for (size_t at = 0; first || at < events->size(); at += kEventsPerMessage) {
      v1::StreamResidencyResponse message;
      message.set_epoch(log.epoch());
      message.set_last_seq(std::max(last, events->empty() ? 0 : events->back().seq));
      const size_t end = std::min(events->size(), at + kEventsPerMessage);
      for (size_t i = at; i < end; ++i) ToProto((*events)[i], message.add_events());
      if (!writer->Write(message)) return grpc::Status::CANCELLED;
      first = false;
    }
    if (!events->empty()) next = events->back().seq + 1;
    log.WaitPast(next - 1, kStreamPoll);
  }
}

grpc::Status ServingNodeAdminImpl::SetAlpha(grpc::ServerContext* context,
                                            const v1::SetAlphaRequest* request,
                                            v1::SetAlphaResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  absl::StatusOr<AlphaResult> r =
      node_.SetAlpha(request->alpha(), request->allocator_epoch(), request->decision_id());
  if (!r.ok()) return ToGrpcStatus(r.status());
  response->set_alpha_target(r->alpha_target);
  response->set_alpha_effective(r->alpha_effective);
  response->set_allocator_epoch(r->allocator_epoch);
  response->set_decision_id(r->decision_id);
  response->set_changed(r->changed);
  response->set_incarnation_epoch(node_.epoch());
  return grpc::Status::OK;
}

grpc::Status ServingNodeAdminImpl::Drain(grpc::ServerContext* context,
                                         const v1::DrainRequest* request,
                                         v1::DrainResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  const DrainResult r = node_.Drain(request->wait(), DeadlineOf(*context));
  response->set_drained(r.drained);
  response->set_in_flight_requests(static_cast<uint32_t>(r.in_flight_requests));
  if (request->wait() && !r.drained) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat(r.in_flight_requests, " requests still in flight"));
  }
  return grpc::Status::OK;
}

grpc::Status ServingNodeAdminImpl::Snapshot(grpc::ServerContext* context,
                                            const v1::SnapshotRequest*,
                                            grpc::ServerWriter<v1::SnapshotChunk>* writer) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  const ResidencySnapshot snap = node_.Snapshot();
  size_t user = 0, shard = 0;
  bool first = true;
  while (first || user < snap.users.size() || shard < snap.shards.size()) {
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    v1::SnapshotChunk chunk;
    chunk.set_node_id(node_.options().node_id);
    chunk.set_epoch(snap.epoch);
    chunk.set_seq(snap.seq);
    if (first) LoadToProto(snap.load, chunk.mutable_load());
    for (size_t n = 0; n < kUsersPerChunk && user < snap.users.size(); ++n, ++user) {
      v1::ResidentUser* u = chunk.add_users();
      u->set_user_id(snap.users[user].first);
      u->set_cached_tokens(static_cast<uint32_t>(snap.users[user].second));
    }
    for (size_t n = 0; n < kUsersPerChunk && shard < snap.shards.size(); ++n, ++shard) {
      v1::ResidencyShardRef* s = chunk.add_resident_shards();
      s->set_table_id(snap.shards[shard].table_id);
      s->set_residency_shard_id(snap.shards[shard].shard);
    }
    if (!writer->Write(chunk)) return grpc::Status::CANCELLED;
    first = false;
  }
  return grpc::Status::OK;
}

}  // namespace hlem::serving
