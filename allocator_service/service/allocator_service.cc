#include "allocator_service/service/allocator_service.h"

#include <algorithm>
#include <cmath>

#include "common/grpc_status.h"
#include "common/logging.h"
#include "google/protobuf/util/time_util.h"

namespace hlem::allocator {
namespace {

google::protobuf::Timestamp Stamp(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

hlem::v1::DecisionReason ReasonOf(const DecisionRecord& r) {
  if (r.no_state) return hlem::v1::DECISION_REASON_NO_STATE;
  switch (r.reason) {
    case Reason::kPolicy:
      return hlem::v1::DECISION_REASON_POLICY;
    case Reason::kRecovery:
      return hlem::v1::DECISION_REASON_RECOVERY;
    case Reason::kStatic:
    case Reason::kBaseline:
      return hlem::v1::DECISION_REASON_BASELINE;
    case Reason::kHold:
      return hlem::v1::DECISION_REASON_NO_STATE;
  }
  return hlem::v1::DECISION_REASON_UNSPECIFIED;
}

void WindowToProto(const WindowState& w, hlem::v1::WindowStats* out) {
  out->set_window_index(w.index);
  out->set_requests(w.requests);
  out->set_hot_user_ratio(w.hot_user_ratio);
  out->set_kv_hit_rate(w.kv_hit_rate);
  out->set_emb_hit_rate(w.emb_hit_rate);
  out->set_mean_seq_len_norm(w.mean_seq_len_norm);
  out->set_slo_violation_fraction(w.slo_violation_fraction);
  out->set_alpha_effective(w.alpha);
  out->set_p99_seconds(w.p99_seconds);
  out->set_slo_seconds(w.slo_seconds);
  out->set_p99_norm_cap(w.p99_norm_cap);
}

}  // namespace

hlem::v1::Decision ToProto(const DecisionRecord& r, const std::string& controller) {
  hlem::v1::Decision d;
  d.set_decision_id(r.decision_id);
  d.set_node_id(r.node_id);
  *d.mutable_decided_at() = Stamp(r.decided_at);
  d.set_window_index(r.window_index);
  d.set_controller(controller);
  d.set_alpha_before(r.alpha_before);
  d.set_alpha_after(r.alpha_after);
  const double delta = r.alpha_after - r.alpha_before;
  switch (r.reason) {
    case Reason::kPolicy:
      d.set_delta_ppo(delta);
      break;
    case Reason::kRecovery:
      d.set_delta_recovery(delta);
      break;
    case Reason::kStatic:
    case Reason::kBaseline:
      d.set_delta_baseline(delta);
      break;
    case Reason::kHold:
      break;
  }
  d.set_reason(ReasonOf(r));
  d.set_reason_detail(r.detail);
  d.set_decision_latency_ns(r.latency_ns);
  d.set_reward(r.reward);
  WindowToProto(r.observed, d.mutable_observed());
  for (double f : Features(r.observed)) d.add_features(static_cast<float>(f));
  d.set_applied(r.applied);
  d.set_apply_error(r.apply_error);
  return d;
}

grpc::Status AllocatorServiceImpl::GetStatus(grpc::ServerContext*,
                                             const hlem::v1::GetStatusRequest*,
                                             hlem::v1::GetStatusResponse* response) {
  const AllocatorOptions& o = allocator_.options();
  response->set_controller(info_.controller);
  response->set_decision_interval_seconds(absl::ToDoubleSeconds(o.interval));
  response->set_alpha_min(info_.bounds.alpha_min);
  response->set_alpha_max(info_.bounds.alpha_max);
  response->set_allocator_epoch(o.epoch);
  response->set_decisions_total(allocator_.counters().decisions);
  *response->mutable_started_at() = Stamp(info_.started_at);
  response->set_policy_weights(info_.policy_weights);
  for (const NodeStatus& s : allocator_.Nodes()) {
    hlem::v1::NodeAllocation* n = response->add_nodes();
    n->set_node_id(s.node_id);
    n->set_admin_address(s.ref.admin_address);
    n->set_alpha(s.alpha);
    n->set_reachable(s.reachable);
    n->set_recovery_active(s.has_decision && s.last.reason == Reason::kRecovery);
    n->set_node_incarnation_epoch(s.incarnation);
    if (s.has_decision) *n->mutable_last_decision() = ToProto(s.last, info_.controller);
  }
  return grpc::Status::OK;
}

grpc::Status AllocatorServiceImpl::ListDecisions(grpc::ServerContext*,
                                                 const hlem::v1::ListDecisionsRequest* request,
                                                 hlem::v1::ListDecisionsResponse* response) {
  if (request->max_decisions() > 1000) {
    return ToGrpcStatus(absl::InvalidArgumentError("max_decisions: at most 1000"));
  }
  if (!request->node_id().empty()) {
    bool known = false;
    for (const NodeStatus& s : allocator_.Nodes()) known = known || s.node_id == request->node_id();
    if (!known) {
      return ToGrpcStatus(
          absl::InvalidArgumentError("node_id: no such node: " + request->node_id()));
    }
  }
  const size_t max = request->max_decisions() == 0 ? 100 : request->max_decisions();
  bool gap = false;
  uint64_t last = request->after_decision_id();
  for (const DecisionRecord& r :
       allocator_.Decisions(request->node_id(), max, request->after_decision_id(), &gap)) {
    *response->add_decisions() = ToProto(r, info_.controller);
    last = std::max(last, r.decision_id);
  }
  response->set_last_decision_id(last);
  response->set_gap(gap);
  return grpc::Status::OK;
}

AllocatorMetrics::AllocatorMetrics(MetricsRegistry& r)
    : alpha_(prometheus::BuildGauge()
                 .Name("hlem_allocator_alpha")
                 .Help("α last pushed to the node and taken (EMB share of its pool)")
                 .Register(*r.registry())),
      reachable_(prometheus::BuildGauge()
                     .Name("hlem_allocator_node_reachable")
                     .Help("1 when the node's last GetState and SetAlpha succeeded")
                     .Register(*r.registry())),
      decisions_(prometheus::BuildCounter()
                     .Name("hlem_allocator_decisions_total")
                     .Help("Decisions by reason (policy, recovery, baseline, no_state)")
                     .Register(*r.registry())),
      last_decision_(prometheus::BuildGauge()
                         .Name("hlem_allocator_last_decision")
                         .Help("α chosen by the node's last decision, labelled with its reason")
                         .Register(*r.registry())),
      decision_latency_(prometheus::BuildHistogram()
                            .Name("hlem_allocator_decision_duration_seconds")
                            .Help("Controller time of one node decision (no RPC)")
                            .Register(*r.registry())
                            .Add({}, ExponentialBuckets(1e-8, 2, 24))),
      round_latency_(prometheus::BuildHistogram()
                         .Name("hlem_allocator_round_duration_seconds")
                         .Help("One round: poll every node, decide, push")
                         .Register(*r.registry())
                         .Add({}, ExponentialBuckets(1e-4, 2, 18))),
      poll_failures_(prometheus::BuildCounter()
                         .Name("hlem_allocator_poll_failures_total")
                         .Help("GetState calls that failed (the node kept its α)")
                         .Register(*r.registry())
                         .Add({})),
      push_failures_(prometheus::BuildCounter()
                         .Name("hlem_allocator_push_failures_total")
                         .Help("SetAlpha calls that failed (retried next round)")
                         .Register(*r.registry())
                         .Add({})),
      nodes_(prometheus::BuildGauge()
                 .Name("hlem_allocator_nodes")
                 .Help("Nodes the allocator knows")
                 .Register(*r.registry())
                 .Add({})) {}

void AllocatorMetrics::AfterRound(const RoundStats& round, Allocator& allocator,
                                  const std::string& controller) {
  static const auto log = GetLogger("allocator");
  absl::MutexLock lock(&mu_);
  round_latency_.Observe(absl::ToDoubleSeconds(round.wall));
  poll_failures_.Increment(static_cast<double>(round.poll_failed));
  push_failures_.Increment(static_cast<double>(round.push_failed));
  nodes_.Set(static_cast<double>(round.nodes));
  bool gap = false;
  // The holds of this round are not in the id-ordered log; count them from the round.
  if (round.poll_failed > 0) {
    decisions_.Add({{"reason", "no_state"}}).Increment(static_cast<double>(round.poll_failed));
  }
  for (const DecisionRecord& r : allocator.Decisions("", 100000, last_id_, &gap)) {
    last_id_ = std::max(last_id_, r.decision_id);
    decisions_.Add({{"reason", ReasonName(r.reason)}}).Increment();
    const std::string reason(ReasonName(r.reason));
    if (auto it = last_reason_.find(r.node_id); it != last_reason_.end() && it->second != reason) {
      last_decision_.Remove(&last_decision_.Add({{"node", r.node_id}, {"reason", it->second}}));
    }
    last_reason_[r.node_id] = reason;
    last_decision_.Add({{"node", r.node_id}, {"reason", reason}}).Set(r.alpha_after);
    decision_latency_.Observe(static_cast<double>(r.latency_ns) * 1e-9);
    log->info(
        "decision id={} node={} window={} controller={} reason={} alpha_before={:.3f} "
        "alpha_after={:.3f} p99_ms={:.2f} slo_violation={:.3f} hot_user_ratio={:.3f} "
        "reward={:.4f} latency_ns={} applied={} detail=\"{}\"{}",
        r.decision_id, r.node_id, r.window_index, controller, ReasonName(r.reason), r.alpha_before,
        r.alpha_after, r.observed.p99_seconds * 1e3, r.observed.slo_violation_fraction,
        r.observed.hot_user_ratio, r.reward, r.latency_ns, r.applied, r.detail,
        r.applied ? "" : " apply_error=\"" + r.apply_error + "\"");
  }
  for (const NodeStatus& s : allocator.Nodes()) {
    if (s.node_id.empty()) continue;
    alpha_.Add({{"node", s.node_id}}).Set(s.alpha);
    reachable_.Add({{"node", s.node_id}}).Set(s.reachable ? 1 : 0);
  }
}

}  // namespace hlem::allocator
