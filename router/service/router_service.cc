#include "router/service/router_service.h"

#include <chrono>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/feature_ids_proto.h"
#include "common/grpc_status.h"
#include "common/shed.h"

namespace hlem::router {

namespace v1 = ::hlem::v1;

v1::RoutingReason ToProto(Reason reason) {
  switch (reason) {
    case Reason::kScore:
      return v1::ROUTING_REASON_SCORE;
    case Reason::kAffinity:
      return v1::ROUTING_REASON_AFFINITY;
    case Reason::kOverloadFallback:
      return v1::ROUTING_REASON_OVERLOAD_FALLBACK;
    case Reason::kAllOverloaded:
      return v1::ROUTING_REASON_ALL_OVERLOADED;
    case Reason::kOnlyNode:
      return v1::ROUTING_REASON_ONLY_NODE;
    case Reason::kPolicy:
      return v1::ROUTING_REASON_POLICY;
    case Reason::kShed:
      return v1::ROUTING_REASON_UNSPECIFIED;
  }
  return v1::ROUTING_REASON_UNSPECIFIED;
}

void RouterServiceImpl::SetNodeStub(int index,
                                    std::shared_ptr<v1::ServingNode::StubInterface> stub) {
  absl::MutexLock lock(&mu_);
  if (index >= static_cast<int>(stubs_.size())) stubs_.resize(static_cast<size_t>(index) + 1);
  stubs_[static_cast<size_t>(index)] = std::move(stub);
}

std::shared_ptr<v1::ServingNode::StubInterface> RouterServiceImpl::Stub(int index) const {
  absl::MutexLock lock(&mu_);
  if (index < 0 || index >= static_cast<int>(stubs_.size())) return nullptr;
  return stubs_[static_cast<size_t>(index)];
}

grpc::Status RouterServiceImpl::Recommend(grpc::ServerContext* context,
                                          const v1::RecommendRequest* request,
                                          v1::RecommendResponse* response) {
  const absl::Time received = absl::Now();
  const uint32_t before = in_flight_.fetch_add(1, std::memory_order_relaxed);
  grpc::Status st = CheckBearerToken(*context, options_.frontend_token, "hlem.v1.Router");
  ConcurrencyLimit::Ticket ticket;
  bool limited = false;  // holds a ticket of the adaptive limit
  if (st.ok() && options_.max_in_flight > 0 && before >= options_.max_in_flight) {
    st = grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("the router is at its limit of ", options_.max_in_flight, " calls in flight"));
  }
  if (st.ok() && options_.concurrency_limit != nullptr) {
    limited = options_.concurrency_limit->Acquire(&ticket);
    if (!limited) {
      const std::string why =
          ticket.measuring_baseline ? "measuring the unloaded latency"
          : ticket.baseline == absl::ZeroDuration()
              ? "the unloaded latency not measured yet"
              : absl::StrCat("unloaded latency ", absl::FormatDuration(ticket.baseline));
      st = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the router is at its adaptive limit of ", ticket.limit,
                                     " calls in flight (", why, ")"));
    }
  }
  LatencySample sample = LatencySample::kNone;
  if (st.ok()) st = Route(context, request, response, &sample);
  if (limited) options_.concurrency_limit->Release(ticket, sample);
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  if (metrics_ != nullptr) {
    // An answer's own router time (the total_seconds it carries) is what the metrics count, so
    // a client's per-request record and the histogram agree exactly.
    metrics_->ObserveRecommend(
        st.error_code(),
        st.ok() ? response->total_seconds() : absl::ToDoubleSeconds(absl::Now() - received));
  }
  return st;
}

grpc::Status RouterServiceImpl::Route(grpc::ServerContext* context,
                                      const v1::RecommendRequest* request,
                                      v1::RecommendResponse* response, LatencySample* sample) {
  const absl::Time received = absl::Now();
  const absl::Time deadline = DeadlineOf(*context);
  auto invalid = [](const std::string& message) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
  };
  if (request->user_id() == 0) return invalid("user_id: required (non-zero)");
  if (request->candidates_size() == 0) return invalid("candidates: none");
  if (static_cast<uint32_t>(request->candidates_size()) > options_.max_candidates) {
    return invalid(absl::StrCat("candidates: ", request->candidates_size(), " exceeds the limit ",
                                options_.max_candidates));
  }
  if (static_cast<uint32_t>(request->history_size()) > options_.max_history_events) {
    return invalid(absl::StrCat("history: ", request->history_size(), " events exceeds the limit ",
                                options_.max_history_events));
  }
  if (deadline <= received) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline passed on arrival");
  }
  // The history's feature ids for the user's shard profile. Every id is checked as the node
  // checks it, counts first (INVALID_ARGUMENT), then rows (OUT_OF_RANGE): a request the node would
  // refuse must not replace the user's profile on its way there.
  const std::span<const FeatureShards> features = cluster_.options().features;
  const size_t F = features.size();
  std::vector<uint64_t> ids;
  if (absl::Status st = AppendFeatureIds(request->history(), F, "history", &ids); !st.ok()) {
    return ToGrpcStatus(st);
  }
  if (absl::Status st = AppendFeatureIds(request->candidates(), F, "candidates", nullptr);
      !st.ok()) {
    return ToGrpcStatus(st);
  }
  if (absl::Status st = CheckIdRows(std::span<const uint64_t>(ids), features, "history");
      !st.ok()) {
    return ToGrpcStatus(st);
  }
  if (absl::Status st = CheckFeatureIdRows(request->candidates(), features, "candidates");
      !st.ok()) {
    return ToGrpcStatus(st);
  }
  const bool delta = request->has_delta() && request->delta().length() > 0;

  v1::InferRequest infer;
  infer.set_user_id(request->user_id());
  *infer.mutable_history() = request->history();
  *infer.mutable_candidates() = request->candidates();
  if (delta) *infer.mutable_delta() = request->delta();
  infer.set_request_id(request->request_id());

  std::vector<int> tried;
  grpc::Status last = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no live serving node");
  double route_seconds = 0;
  retry_budget_.OnRequest();
  for (int attempt = 0; attempt < (options_.retry ? 2 : 1); ++attempt) {
    if (attempt > 0 && absl::Now() >= deadline) break;
    const absl::Time route_start = absl::Now();
    // A retry re-reads only the decision: the profile was updated by the first attempt.
    const RouteResult r = attempt == 0 ? cluster_.Route(request->user_id(), ids, delta, tried)
                                       : cluster_.Route(request->user_id(), {}, true, tried);
    const double decision_seconds = absl::ToDoubleSeconds(absl::Now() - route_start);
    route_seconds += decision_seconds;
    if (metrics_ != nullptr) metrics_->ObserveDecision(r.decision, decision_seconds);
    if (r.decision.node < 0) {
      if (r.decision.reason == Reason::kShed) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "every serving node is above the load threshold");
      }
      break;
    }
    std::shared_ptr<v1::ServingNode::StubInterface> stub = Stub(r.decision.node);
    if (stub == nullptr) {
      cluster_.Completed(r.decision.node, r.node_generation);
      tried.push_back(r.decision.node);
      continue;
    }
    infer.set_expected_kv_resident(r.decision.h_kv >= 1.0);
    grpc::ClientContext node_context;
    SetDeadline(node_context, deadline);
    v1::InferResponse out;
    last = stub->Infer(&node_context, infer, &out);
    cluster_.Completed(r.decision.node, r.node_generation);
    tried.push_back(r.decision.node);
    if (last.ok()) {
      if (out.stale_kv_hit())
        cluster_.Forget(r.decision.node, request->user_id(), r.node_generation);
      if (options_.calibrator != nullptr) {
        options_.calibrator->Observe({.computed_tokens = out.computed_tokens(),
                                      .history_tokens = out.history_tokens(),
                                      .emb_hits = out.emb_hits(),
                                      .emb_misses = out.emb_misses(),
                                      .compute_seconds = out.timings().compute_seconds(),
                                      .fetch_seconds = out.timings().emb_fetch_seconds(),
                                      .queue_seconds = out.timings().queue_seconds(),
                                      .load = r.decision.load});
      }
      response->mutable_scores()->Swap(out.mutable_scores());
      response->set_num_tasks(out.num_tasks());
      *response->mutable_next_prefix() = out.next_prefix();
      response->set_node_id(r.node_id);
      response->set_reason(ToProto(r.decision.reason));
      response->set_h_kv(r.decision.h_kv);
      response->set_h_emb(r.decision.h_emb);
      response->set_load(r.decision.load);
      response->set_score(r.decision.score);
      response->set_retried(attempt > 0);
      response->set_attempts(static_cast<uint32_t>(attempt + 1));
      response->set_cached_prefix_tokens(out.cached_prefix_tokens());
      response->set_computed_tokens(out.computed_tokens());
      response->set_emb_hits(out.emb_hits());
      response->set_emb_misses(out.emb_misses());
      response->set_stale_kv_hit(out.stale_kv_hit());
      response->set_route_seconds(route_seconds);
      *response->mutable_node_timings() = out.timings();
      response->set_total_seconds(absl::ToDoubleSeconds(absl::Now() - received));
      *sample = LatencySample::kFull;
      return grpc::Status::OK;
    }
    // The node did not serve it, so it holds no new K/V of the user: the speculative belief Route
    // took for this dispatch would route the user's next request there as a KV hit (stale).
    cluster_.Forget(r.decision.node, request->user_id(), r.node_generation);
    // The request's own error (bad input, delta prefix, deadline) and a late shed go back as
    // they are; a node down or refusing at admission gets the request's one retry.
    absl::Status failed = FromGrpcStatus(last);
    const auto& trailers = node_context.GetServerTrailingMetadata();
    if (auto it = trailers.find(kShedMetadataKey);
        it != trailers.end() && it->second == kShedLateValue) {
      failed = MarkShedLate(std::move(failed));
    }
    // Out of time at a node, or shed after waiting out its queue: the cluster's load shows.
    if (failed.code() == absl::StatusCode::kDeadlineExceeded || IsShedLate(failed)) {
      *sample = LatencySample::kLoad;
    }
    if (!RetryElsewhere(failed)) return last;
    if (attempt == 0 && options_.retry) {
      const bool sent = retry_budget_.TryRetry();
      if (metrics_ != nullptr) metrics_->ObserveRetry(sent);
      if (!sent) return last;
    }
  }
  return last;
}

grpc::Status RouterServiceImpl::GetRoutingState(grpc::ServerContext* context,
                                                const v1::GetRoutingStateRequest*,
                                                v1::GetRoutingStateResponse* response) {
  if (grpc::Status s = CheckBearerToken(*context, options_.frontend_token, "hlem.v1.Router");
      !s.ok()) {
    return s;
  }
  const ClusterOptions& o = cluster_.options();
  const Weights w = cluster_.weights();
  response->set_policy(PolicyName(o.policy));
  response->set_w_kv(w.kv);
  response->set_w_emb(w.emb);
  response->set_w_load(w.load);
  response->set_load_threshold(o.scorer.tau);
  response->set_affinity_bonus(o.scorer.epsilon);
  response->set_profile_top_k(o.profile_top_k);
  response->set_all_overloaded_rule(
      o.scorer.all_overloaded == AllOverloaded::kShed ? "shed" : "least_loaded");
  response->set_cached_profiles(cluster_.Stats().cached_profiles);
  for (const NodeStatus& n : cluster_.Nodes()) {
    v1::NodeRoutingView* v = response->add_nodes();
    v->set_node_id(n.id);
    v->set_address(n.address);
    v->set_view(n.view == NodeView::kExact      ? v1::NODE_VIEW_EXACT
                : n.view == NodeView::kDegraded ? v1::NODE_VIEW_DEGRADED
                                                : v1::NODE_VIEW_UNREACHABLE);
    v->set_epoch(n.epoch);
    v->set_last_seq(n.last_seq);
    v->set_load(n.load);
    v->set_reported_load(n.reported_load);
    v->set_last_report_age_seconds(
        n.report_age == absl::InfiniteDuration() ? -1 : absl::ToDoubleSeconds(n.report_age));
    v->set_in_flight_requests(n.in_flight);
    v->set_draining(n.draining);
    v->set_resident_users(n.resident_users);
    v->set_speculative_users(n.speculative_users);
    v->set_resident_shards(n.resident_shards);
    v->set_dispatches(n.dispatches);
  }
  return grpc::Status::OK;
}

}  // namespace hlem::router
