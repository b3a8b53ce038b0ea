#include "tools/loadgen/replayer.h"

#include <deque>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "grpcpp/client_context.h"
#include "hlem/v1/router.grpc.pb.h"

namespace hlem::loadgen {

namespace {

namespace v1 = ::hlem::v1;

struct UserState {
  std::vector<uint64_t> history;  // feature-major events, all of them
  uint32_t in_flight = 0;         // calls of the user out now
  bool prefix_valid = false;      // the last answer named the whole history as next_prefix
  v1::HistoryPrefix prefix;
};

class Replayer {
 public:
  Replayer(const ReplayOptions& options, size_t features)
      : options_(options),
        F_(features),
        stub_(v1::Router::NewStub(MakeChannel(options.router, options.channel))) {}

  absl::Status Run(sim::TraceReader& trace, std::vector<Outcome>* out);

 private:
  struct Call {
    uint64_t index = 0, user = 0;
    std::unique_ptr<grpc::ClientContext> ctx;
    v1::RecommendRequest req;
    v1::RecommendResponse resp;
    absl::Time sent, deadline;
    uint64_t events = 0;  // the user's history length this request carries (full or via delta)
    bool delta = false, resent = false;
  };

  void AddEvents(const std::vector<uint64_t>& ids, size_t from, size_t to,
                 google::protobuf::RepeatedPtrField<v1::Event>* out) const {
    for (size_t e = from; e < to; ++e) {
      v1::Event* ev = out->Add();
      ev->set_item_id(ids[e * F_]);
      for (size_t f = 0; f < F_; ++f) ev->add_feature_ids(ids[e * F_ + f]);
    }
  }
  void Start(Call* call);
  void Done(Call* call, const grpc::Status& status);
  // Writes the call's outcome and updates its user's state.
  void Record(const Call& call, const grpc::Status& status, absl::Time now);

  const ReplayOptions options_;
  const size_t F_;
  std::unique_ptr<v1::Router::Stub> stub_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, UserState> users_ ABSL_GUARDED_BY(mu_);
  std::deque<Outcome> outcomes_ ABSL_GUARDED_BY(mu_);
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t recorded_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time start_;
};

void Replayer::Start(Call* call) {
  call->ctx = std::make_unique<grpc::ClientContext>();
  SetDeadline(*call->ctx, call->deadline);
  stub_->async()->Recommend(call->ctx.get(), &call->req, &call->resp,
                            [this, call](grpc::Status s) { Done(call, s); });
}

void Replayer::Done(Call* call, const grpc::Status& status) {
  const absl::Time now = absl::Now();
  if (!status.ok() && status.error_code() == grpc::StatusCode::FAILED_PRECONDITION && call->delta &&
      !call->resent) {
    // The node no longer holds the named prefix: the whole history, at once.
    {
      absl::MutexLock lock(&mu_);
      // Only this request's history: later requests of the user may have added events since.
      const UserState& u = users_[call->user];
      call->req.clear_history();
      call->req.clear_delta();
      AddEvents(u.history, 0, call->events, call->req.mutable_history());
    }
    call->resent = true;
    Start(call);
    return;
  }
  std::unique_ptr<Call> owned(call);
  Record(*call, status, now);
  // The call's context and messages go before the call stops counting as in flight: once the
  // last one is out, Run returns and the process may exit.
  owned.reset();
  absl::MutexLock lock(&mu_);
  --in_flight_;
  ++recorded_;
}

void Replayer::Record(const Call& call, const grpc::Status& status, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Outcome& o = outcomes_[call.index];
  o.sent = true;
  o.latency_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(now - call.sent));
  o.code = static_cast<int>(status.error_code());
  o.delta = call.delta;
  o.resent = call.resent;
  UserState& u = users_[call.user];
  --u.in_flight;
  u.prefix_valid = false;
  if (status.ok()) {
    const v1::RecommendResponse& r = call.resp;
    o.node = r.node_id();
    o.h_kv = r.h_kv();
    o.h_emb = r.h_emb();
    o.cached_prefix_tokens = r.cached_prefix_tokens();
    o.computed_tokens = r.computed_tokens();
    o.emb_hits = r.emb_hits();
    o.emb_misses = r.emb_misses();
    o.stale_kv_hit = r.stale_kv_hit();
    o.router_ns = static_cast<uint64_t>(r.total_seconds() * 1e9);
    const v1::InferTimings& t = r.node_timings();
    auto ns = [](double s) { return static_cast<uint64_t>(s * 1e9); };
    o.node_ns = ns(t.total_seconds());
    o.stages = {.queue_ns = ns(t.queue_seconds()),
                .lookup_ns = ns(t.emb_lookup_seconds()),
                .fetch_ns = ns(t.emb_fetch_seconds()),
                .copy_ns = ns(t.copy_seconds()),
                .compute_ns = ns(t.compute_seconds()),
                .kv_ns = ns(t.kv_append_seconds())};
    o.retried = r.retried();
    // The answer names the history as it was when sent; valid while no event was added since.
    if (u.in_flight == 0 && r.next_prefix().length() == u.history.size() / F_) {
      u.prefix = r.next_prefix();
      u.prefix_valid = true;
    }
  } else {
    o.message = status.error_message();
  }
  if (options_.on_outcome) options_.on_outcome(o);
}

absl::Status Replayer::Run(sim::TraceReader& trace, std::vector<Outcome>* out) {
  start_ = absl::Now();
  absl::Time last_progress = start_;
  sim::TraceRequest r;
  absl::Status result = absl::OkStatus();
  uint64_t index = 0;
  while (options_.limit == 0 || index < options_.limit) {
    absl::StatusOr<bool> more = trace.Next(&r);
    if (!more.ok()) {
      result = more.status();
      break;
    }
    if (!*more) break;
    const uint64_t scheduled_ns =
        static_cast<uint64_t>(static_cast<double>(r.t_ns) / options_.speed);
    const absl::Time due = start_ + absl::Nanoseconds(scheduled_ns);
    if (const absl::Time now = absl::Now(); due > now) absl::SleepFor(due - now);
    auto call = std::make_unique<Call>();
    call->index = index;
    call->user = r.user;
    for (size_t c = 0; c < r.candidates.size() / F_; ++c) {
      v1::Candidate* cand = call->req.add_candidates();
      cand->set_item_id(r.candidates[c * F_]);
      for (size_t f = 0; f < F_; ++f) cand->add_feature_ids(r.candidates[c * F_ + f]);
    }
    call->req.set_user_id(r.user);
    call->req.set_request_id(absl::StrCat("loadgen-", index));
    bool refused = false;
    {
      absl::MutexLock lock(&mu_);
      outcomes_.push_back({.index = index,
                           .scheduled_ns = scheduled_ns,
                           .sent_ns = scheduled_ns,
                           .user = r.user,
                           .candidates = static_cast<uint32_t>(r.candidates.size() / F_)});
      UserState& u = users_[r.user];
      const size_t before = u.history.size() / F_;
      u.history.insert(u.history.end(), r.new_events.begin(), r.new_events.end());
      if (in_flight_ >= options_.max_in_flight) {
        Outcome& o = outcomes_.back();
        o.code = static_cast<int>(absl::StatusCode::kResourceExhausted);
        o.message = absl::StrCat("loadgen: ", in_flight_, " calls already in flight");
        ++recorded_;
        if (options_.on_outcome) options_.on_outcome(o);
        refused = true;
      } else {
        call->delta =
            options_.delta && u.prefix_valid && u.in_flight == 0 && u.prefix.length() == before;
        if (call->delta) {
          *call->req.mutable_delta() = u.prefix;
          AddEvents(u.history, before, u.history.size() / F_, call->req.mutable_history());
        } else {
          AddEvents(u.history, 0, u.history.size() / F_, call->req.mutable_history());
        }
        ++u.in_flight;
        u.prefix_valid = false;
        call->events = u.history.size() / F_;
        ++in_flight_;
        call->sent = absl::Now();
        outcomes_.back().sent_ns =
            static_cast<uint64_t>(absl::ToInt64Nanoseconds(call->sent - start_));
      }
    }
    if (!refused) {
      call->deadline = call->sent + options_.deadline;
      Start(call.release());
    }
    ++index;
    if (options_.progress && absl::Now() - last_progress >= absl::Seconds(1)) {
      last_progress = absl::Now();
      absl::MutexLock lock(&mu_);
      options_.progress(index, recorded_, in_flight_);
    }
  }
  // Every call ends by its deadline.
  absl::MutexLock lock(&mu_);
  while (in_flight_ > 0) {
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](uint64_t* n) { return *n == 0; }, &in_flight_),
                         absl::Seconds(1));
    if (options_.progress) options_.progress(index, recorded_, in_flight_);
  }
  out->assign(outcomes_.begin(), outcomes_.end());
  return result;
}

}  // namespace

absl::Status Replay(sim::TraceReader& trace, const ReplayOptions& options,
                    std::vector<Outcome>* outcomes) {
  if (options.router.empty()) return absl::InvalidArgumentError("--router: required");
  if (!(options.speed > 0)) return absl::InvalidArgumentError("--speed: must be > 0");
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--deadline-ms: must be > 0");
  }
  if (options.max_in_flight == 0) return absl::InvalidArgumentError("--max-in-flight: must be > 0");
  Replayer replayer(options, trace.header().features.size());
  return replayer.Run(trace, outcomes);
}

}  // namespace hlem::loadgen
