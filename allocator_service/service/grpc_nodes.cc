#include "allocator_service/service/grpc_nodes.h"

#include <utility>

#include "common/grpc_server.h"
#include "common/grpc_status.h"

namespace hlem::allocator {
namespace {

// One call's context and messages, alive until its callback has run.
template <typename Request, typename Response>
struct Call {
  grpc::ClientContext context;
  Request request;
  Response response;
};

}  // namespace

WindowState FromProto(const hlem::v1::WindowStats& w) {
  return {.index = w.window_index(),
          .requests = w.requests(),
          .hot_user_ratio = w.hot_user_ratio(),
          .kv_hit_rate = w.kv_hit_rate(),
          .emb_hit_rate = w.emb_hit_rate(),
          .mean_seq_len_norm = w.mean_seq_len_norm(),
          .slo_violation_fraction = w.slo_violation_fraction(),
          .alpha = w.alpha_effective(),
          .p99_seconds = w.p99_seconds(),
          .slo_seconds = w.slo_seconds(),
          .p99_norm_cap = w.p99_norm_cap() > 0 ? w.p99_norm_cap() : 4};
}

hlem::v1::ServingNode::Stub& GrpcNodeApi::Serving(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = serving_[address];
  if (stub == nullptr)
    stub = hlem::v1::ServingNode::NewStub(MakeChannel(address, serving_channel_));
  return *stub;
}

hlem::v1::ServingNodeAdmin::Stub& GrpcNodeApi::Admin(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = admin_[address];
  if (stub == nullptr)
    stub = hlem::v1::ServingNodeAdmin::NewStub(MakeChannel(address, admin_channel_));
  return *stub;
}

void GrpcNodeApi::GetState(const std::string& address, absl::Duration timeout,
                           std::function<void(absl::StatusOr<State>)> done) {
  using C = Call<hlem::v1::GetStateRequest, hlem::v1::GetStateResponse>;
  auto* call = new C;
  call->request.set_max_windows(max_windows_);
  SetDeadline(call->context, absl::Now() + timeout);
  Serving(address).async()->GetState(
      &call->context, &call->request, &call->response,
      [call, done = std::move(done)](grpc::Status status) {
        std::unique_ptr<C> owned(call);
        if (!status.ok()) return done(FromGrpcStatus(status));
        State s{.node_id = owned->response.node_id(),
                .incarnation = owned->response.incarnation_epoch()};
        for (const hlem::v1::WindowStats& w : owned->response.windows()) {
          s.windows.push_back(FromProto(w));
        }
        done(std::move(s));
      });
}

void GrpcNodeApi::SetAlpha(const std::string& admin_address, const Push& push,
                           absl::Duration timeout,
                           std::function<void(absl::StatusOr<Applied>)> done) {
  using C = Call<hlem::v1::SetAlphaRequest, hlem::v1::SetAlphaResponse>;
  auto* call = new C;
  call->request.set_alpha(push.alpha);
  call->request.set_allocator_epoch(push.allocator_epoch);
  call->request.set_decision_id(push.decision_id);
  call->request.set_allocator_id(push.allocator_id);
  SetDeadline(call->context, absl::Now() + timeout);
  Admin(admin_address)
      .async()
      ->SetAlpha(&call->context, &call->request, &call->response,
                 [call, done = std::move(done)](grpc::Status status) {
                   std::unique_ptr<C> owned(call);
                   if (!status.ok()) return done(FromGrpcStatus(status));
                   done(Applied{.alpha_effective = owned->response.alpha_effective(),
                                .incarnation = owned->response.incarnation_epoch()});
                 });
}

}  // namespace hlem::allocator
