#include "serving_node/core/node.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hlem::serving {
namespace {

// Codes that are the client's doing: they do not count against the SLO.
bool ClientError(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
      return true;
    default:
      return false;
  }
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  // Nearest rank: the smallest sample with at least q of the samples at or below it.
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  const size_t k = std::min(v.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

double Ratio(uint64_t num, uint64_t den) {
  return den == 0 ? 0.0 : static_cast<double>(num) / static_cast<double>(den);
}

}  // namespace

struct Node::Accumulator {
  absl::Time start;
  uint64_t requests = 0, ok = 0, hot = 0, judged = 0, violations = 0, expected = 0, stale = 0;
  uint64_t history_tokens = 0;
  std::vector<double> latencies;  // seconds, reservoir
  uint64_t latencies_seen = 0;
  double load_sum = 0;
  uint64_t load_samples = 0;
};

absl::StatusOr<std::unique_ptr<Node>> Node::Create(const NodeOptions& options,
                                                   const NodeParts& parts, Clock& clock) {
  const bool runs =
      parts.executor != nullptr || (parts.pipeline != nullptr && parts.queue != nullptr);
  if (!runs || parts.memory == nullptr || parts.kv == nullptr || parts.emb == nullptr ||
      parts.device == nullptr || parts.events == nullptr || parts.residency == nullptr) {
    return absl::InvalidArgumentError("node: a required part is missing");
  }
  if (parts.row_bytes == 0) return absl::InvalidArgumentError("node: row_bytes is 0");
  if (parts.max_queue == 0) return absl::InvalidArgumentError("node: max_queue is 0");
  if (options.slo <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("node.slo: must be > 0");
  }
  if (options.window <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("node.window: must be > 0");
  }
  if (options.keep_windows == 0) return absl::InvalidArgumentError("node.keep_windows: 0");
  if (options.max_in_flight_tokens == 0) {
    return absl::InvalidArgumentError("node.max_in_flight_tokens: 0");
  }
  if (options.latency_samples == 0) return absl::InvalidArgumentError("node.latency_samples: 0");
  if (!(options.p99_norm_cap > 0)) {
    return absl::InvalidArgumentError("node.p99_norm_cap: must be > 0");
  }
  if (options.load_report_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("node.load_report_interval: must be > 0");
  }
  if (options.refill_check_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("node.refill_check_interval: must be > 0");
  }
  return std::unique_ptr<Node>(new Node(options, parts, clock));
}

Node::Node(const NodeOptions& options, const NodeParts& parts, Clock& clock)
    : options_(options),
      parts_(parts),
      owned_executor_(parts.executor != nullptr
                          ? nullptr
                          : std::make_unique<QueuedPipeline>(*parts.pipeline, *parts.queue)),
      executor_(parts.executor != nullptr ? parts.executor : owned_executor_.get()),
      clock_(clock),
      rng_(options.seed),
      memory_windows_(options.keep_windows) {
  acc_ = std::make_unique<Accumulator>();
  acc_->start = clock_.Now();
  memory_windows_.Start(ReadMemoryCounters(*parts_.kv, *parts_.emb, *parts_.memory, parts_.refiller,
                                           *parts_.device, acc_->start));
  emb_budget_seen_ = parts_.memory->State().emb_budget_pages;
}

Node::~Node() {
  Stop();
  // An answer's `done` may have let the owner go on to destroy the node while the answering thread
  // still does the bookkeeping after it.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](uint64_t* answering) { return *answering == 0; }, &answering_));
}

void Node::Start() {
  absl::MutexLock lock(&timers_->mu);
  if (timers_->running) return;
  timers_->running = true;
  const absl::Time now = clock_.Now();
  ScheduleWindow(now + options_.window);
  ScheduleLoadReport(now);
  ScheduleRefillCheck(now + options_.refill_check_interval);
}

void Node::Stop() {
  absl::MutexLock lock(&timers_->mu);
  if (!timers_->running) return;
  timers_->running = false;
  clock_.Cancel(timers_->window);
  clock_.Cancel(timers_->load);
  clock_.Cancel(timers_->refill);
}

void Node::ScheduleWindow(absl::Time at) {
  timers_->window = clock_.ScheduleAt(at, [this, ts = timers_, at] {
    absl::MutexLock lock(&ts->mu);
    if (!ts->running) return;
    CloseWindow();
    ScheduleWindow(std::max(at + options_.window, clock_.Now()));
  });
}

void Node::ScheduleLoadReport(absl::Time at) {
  timers_->load = clock_.ScheduleAt(at, [this, ts = timers_, at] {
    absl::MutexLock lock(&ts->mu);
    if (!ts->running) return;
    ReportLoad();
    ScheduleLoadReport(std::max(at + options_.load_report_interval, clock_.Now()));
  });
}

void Node::ScheduleRefillCheck(absl::Time at) {
  timers_->refill = clock_.ScheduleAt(at, [this, ts = timers_, at] {
    absl::MutexLock lock(&ts->mu);
    if (!ts->running) return;
    CheckRefill();
    ScheduleRefillCheck(std::max(at + options_.refill_check_interval, clock_.Now()));
  });
}

void Node::CheckRefill() {
  if (parts_.refiller == nullptr) return;
  // The EMB budget grows in steps as the manager reclaims idle KV users: refill what it won.
  const uint32_t budget = parts_.memory->State().emb_budget_pages;
  bool kick = false, cancel = false;
  {
    absl::MutexLock lock(&mu_);
    kick = budget > emb_budget_seen_;
    cancel = budget < emb_budget_seen_;
    emb_budget_seen_ = budget;
  }
  if (kick) parts_.refiller->Kick();
  if (cancel) parts_.refiller->Cancel();
}

void Node::Infer(InferInput in, Done done) {
  const absl::Time received = clock_.Now();
  const uint64_t user = in.user;
  const bool expected = in.expected_kv_resident;
  if (draining()) {
    Answer(user, expected, 0, received, false, absl::UnavailableError("node is draining"), done);
    return;
  }
  if (absl::Status st = executor_->Check(in); !st.ok()) {
    Answer(user, expected, 0, received, false, st, done);
    return;
  }
  const size_t F = executor_->features();
  const uint64_t tokens = (in.history.size() + in.candidates.size()) / F + in.omitted_events;
  uint64_t busy = 0;  // tokens in flight when the request is shed; 0 when admitted
  bool drain_began = false;
  {
    // Draining is checked again with the count, under the lock Drain sets it under: a request
    // either counts before Drain looks (and Drain waits for it) or is refused.
    absl::MutexLock lock(&mu_);
    if (draining_) {
      drain_began = true;
    } else if (in_flight_tokens_ > 0 &&
               in_flight_tokens_ + tokens > options_.max_in_flight_tokens) {
      busy = in_flight_tokens_;
    } else {
      in_flight_tokens_ += tokens;
      ++in_flight_requests_;
    }
  }
  if (drain_began) {
    Answer(user, expected, 0, received, false, absl::UnavailableError("node is draining"), done);
    return;
  }
  if (busy > 0) {
    Answer(user, expected, 0, received, false,
           absl::ResourceExhaustedError(
               absl::StrCat("node overloaded: ", busy, " tokens in flight + ", tokens,
                            " exceeds max_in_flight_tokens ", options_.max_in_flight_tokens)),
           done);
    return;
  }
  MaybeReportLoad();
  // The requests queued before this one must not evict the K/V it is about to reuse.
  parts_.kv->Touch(user);
  executor_->Submit(std::move(in), [this, user, expected, tokens, received,
                                    done = std::move(done)](absl::StatusOr<InferOutput> r) {
    Answer(user, expected, tokens, received, true, std::move(r), done);
  });
}

absl::StatusOr<InferOutput> Node::InferSync(InferInput in) {
  absl::Mutex mu;
  std::optional<absl::StatusOr<InferOutput>> result;
  Infer(std::move(in), [&](absl::StatusOr<InferOutput> r) {
    absl::MutexLock lock(&mu);
    result = std::move(r);
  });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](std::optional<absl::StatusOr<InferOutput>>* r) { return r->has_value(); }, &result));
  return std::move(*result);
}

void Node::Answer(uint64_t user, bool expected, uint64_t tokens, absl::Time received, bool admitted,
                  absl::StatusOr<InferOutput> result, const Done& done) {
  const absl::Duration latency = clock_.Now() - received;
  const absl::StatusCode code = result.status().code();
  {
    absl::MutexLock lock(&mu_);
    ++answering_;
    Accumulator& a = *acc_;
    ++a.requests;
    if (!ClientError(code)) {
      ++a.judged;
      if (code != absl::StatusCode::kOk || latency > options_.slo) ++a.violations;
      const double s = absl::ToDoubleSeconds(latency);
      ++a.latencies_seen;
      if (a.latencies.size() < options_.latency_samples) {
        a.latencies.push_back(s);
      } else if (const uint64_t j = rng_() % a.latencies_seen; j < a.latencies.size()) {
        a.latencies[j] = s;
      }
    }
    if (result.ok()) {
      ++a.ok;
      a.history_tokens += result->history_tokens;
      if (expected) {
        ++a.expected;
        if (result->stale_kv_hit) ++a.stale;
      }
      auto [it, fresh] = last_served_.try_emplace(user, window_index_);
      if (!fresh && it->second + options_.hot_windows >= window_index_) ++a.hot;
      it->second = window_index_;
      shard_fetch_bytes_ += result->emb_misses * parts_.row_bytes;
    }
  }
  if (observer_) {
    observer_({.code = code, .latency = latency, .output = result.ok() ? &*result : nullptr});
  }
  done(std::move(result));
  // In flight until answered: Drain(wait) returns only after every `done` ran.
  if (admitted) {
    {
      absl::MutexLock lock(&mu_);
      in_flight_tokens_ -= tokens;
      --in_flight_requests_;
    }
    MaybeReportLoad();
  }
  // The caller may destroy the node as soon as `done` ran; the destructor waits for this.
  absl::MutexLock lock(&mu_);
  --answering_;
}

bool Node::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

double Node::LoadLocked(uint64_t queue_depth) const {
  if (draining_) return 1.0;
  return std::min(1.0, std::max(Ratio(in_flight_tokens_, options_.max_in_flight_tokens),
                                Ratio(queue_depth, parts_.max_queue)));
}

void Node::MaybeReportLoad() {
  const uint64_t depth = executor_->queue_depth();
  {
    absl::MutexLock lock(&mu_);
    const double load = LoadLocked(depth);
    if (std::abs(load - last_reported_load_) < options_.load_report_change) return;
  }
  ReportLoad();
}

void Node::ReportLoad() {
  const uint64_t depth = executor_->queue_depth();
  const double alpha = parts_.memory->State().effective_alpha;
  ResidencyEvent event;
  event.kind = ResidencyEvent::Kind::kLoadReport;
  {
    absl::MutexLock lock(&mu_);
    event.load = {.load = LoadLocked(depth),
                  .queue_depth = static_cast<uint32_t>(depth),
                  .in_flight_tokens = in_flight_tokens_,
                  .draining = draining_,
                  .alpha_effective = alpha};
    last_reported_load_ = event.load.load;
    acc_->load_sum += event.load.load;
    ++acc_->load_samples;
  }
  parts_.events->Publish(event);
}

absl::StatusOr<AlphaResult> Node::SetAlpha(double alpha, uint64_t allocator_epoch,
                                           uint64_t decision_id) {
  if (!(alpha >= 0.0 && alpha <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("alpha: ", alpha, " is not in [0, 1]"));
  }
  if (allocator_epoch == 0) return absl::InvalidArgumentError("allocator_epoch: must be > 0");
  absl::MutexLock order(&alpha_mu_);
  uint64_t last_epoch, last_decision;
  {
    absl::MutexLock lock(&mu_);
    last_epoch = alpha_epoch_;
    last_decision = alpha_decision_;
  }
  const auto pair = std::make_pair(allocator_epoch, decision_id);
  const auto last = std::make_pair(last_epoch, last_decision);
  if (pair < last) {
    return absl::FailedPreconditionError(
        absl::StrCat("stale alpha decision (epoch ", allocator_epoch, ", decision ", decision_id,
                     "): the node already applied (", last_epoch, ", ", last_decision, ")"));
  }
  if (pair == last) {
    const MemoryState m = parts_.memory->State();
    return AlphaResult{.alpha_target = m.target_alpha,
                       .alpha_effective = m.effective_alpha,
                       .allocator_epoch = last_epoch,
                       .decision_id = last_decision,
                       .changed = false};
  }
  absl::StatusOr<MemoryState> m = parts_.memory->SetAlpha(alpha, allocator_epoch);
  if (!m.ok()) return m.status();
  {
    absl::MutexLock lock(&mu_);
    alpha_epoch_ = allocator_epoch;
    alpha_decision_ = decision_id;
  }
  CheckRefill();
  return AlphaResult{.alpha_target = m->target_alpha,
                     .alpha_effective = m->effective_alpha,
                     .allocator_epoch = allocator_epoch,
                     .decision_id = decision_id,
                     .changed = true};
}

DrainResult Node::Drain(bool wait, absl::Time deadline) {
  bool was_draining;
  {
    absl::MutexLock lock(&mu_);
    was_draining = draining_;
    draining_ = true;
  }
  if (!was_draining) ReportLoad();
  absl::MutexLock lock(&mu_);
  if (wait) {
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return in_flight_requests_ == 0; };
    mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  }
  return {.drained = in_flight_requests_ == 0, .in_flight_requests = in_flight_requests_};
}

NodeWindow Node::CloseWindow() {
  absl::MutexLock order(&close_mu_);
  const absl::Time now = clock_.Now();
  if (parts_.tracker != nullptr) parts_.tracker->CloseWindow();
  const MemoryWindow m = memory_windows_.Close(ReadMemoryCounters(
      *parts_.kv, *parts_.emb, *parts_.memory, parts_.refiller, *parts_.device, now));
  const NodeGaugesNow g = Gauges();
  std::unique_ptr<Accumulator> a;
  NodeWindow w;
  {
    absl::MutexLock lock(&mu_);
    a = std::exchange(acc_, std::make_unique<Accumulator>());
    acc_->start = now;
    w.index = window_index_++;
    w.shard_fetch_bytes = shard_fetch_bytes_ - shard_fetch_bytes_at_close_;
    shard_fetch_bytes_at_close_ = shard_fetch_bytes_;
    // Users not served in the hot horizon are no longer returning.
    if (window_index_ > options_.hot_windows) {
      const uint64_t oldest = window_index_ - options_.hot_windows;
      absl::erase_if(last_served_, [oldest](const auto& e) { return e.second < oldest; });
    }
  }
  const uint32_t max_history = executor_->max_history();
  w.start = a->start;
  w.duration = now - a->start;
  w.requests = a->requests;
  w.hot_user_ratio = Ratio(a->hot, a->ok);
  w.kv_hit_rate = m.kv_hit_rate;
  w.kv_user_hit_rate = m.kv_user_hit_rate;
  w.emb_hit_rate = m.emb_hit_rate;
  w.mean_seq_len_tokens = Ratio(a->history_tokens, a->ok);
  w.mean_seq_len_norm = std::min(1.0, w.mean_seq_len_tokens / max_history);
  w.slo_violation_fraction = Ratio(a->violations, a->judged);
  w.stale_hit_rate = Ratio(a->stale, a->expected);
  w.hot_window_count = options_.hot_windows;
  w.max_history_tokens = max_history;
  w.alpha_target = m.alpha_target;
  w.alpha_effective = m.alpha_effective;
  w.p50_seconds = Quantile(a->latencies, 0.5);
  w.p99_seconds = Quantile(a->latencies, 0.99);
  w.slo_seconds = absl::ToDoubleSeconds(options_.slo);
  w.p99_norm_cap = options_.p99_norm_cap;
  w.p99_norm = std::min(w.p99_seconds / w.slo_seconds, w.p99_norm_cap) / w.p99_norm_cap;
  w.load = g.load;
  w.queue_depth = g.queue_depth;
  w.in_flight_tokens = g.in_flight_tokens;
  w.mean_load = a->load_samples == 0 ? g.load : a->load_sum / a->load_samples;
  w.pool_bytes = g.pool_bytes;
  w.kv_bytes = m.kv_bytes;
  w.emb_bytes = m.emb_bytes;
  w.free_bytes = g.free_bytes;
  w.refill_bytes = m.refill_bytes;
  w.refill_backlog_bytes = m.refill_backlog_rows * parts_.row_bytes;
  w.emb_miss_bytes = m.miss_bytes;
  w.shard_fetch_bytes += m.refill_bytes;  // refill reads its rows from the shards too
  w.link_utilization_ratio = m.link_utilisation;
  w.link_bytes_per_second = parts_.link_bytes_per_second;
  {
    absl::MutexLock lock(&mu_);
    windows_.push_back(w);
    if (windows_.size() > options_.keep_windows) windows_.erase(windows_.begin());
  }
  return w;
}

std::vector<NodeWindow> Node::Windows(size_t max) const {
  absl::MutexLock lock(&mu_);
  const size_t n = std::min(std::max<size_t>(max, 1), windows_.size());
  return std::vector<NodeWindow>(windows_.end() - static_cast<std::ptrdiff_t>(n), windows_.end());
}

NodeGaugesNow Node::Gauges() const {
  NodeGaugesNow g;
  const uint64_t depth = executor_->queue_depth();
  const MemoryState m = parts_.memory->State();
  const uint64_t page_bytes = m.pages == 0 ? 0 : parts_.device->pool_bytes() / m.pages;
  g.queue_depth = static_cast<uint32_t>(depth);
  g.alpha_target = m.target_alpha;
  g.alpha_effective = m.effective_alpha;
  g.pool_bytes = uint64_t{m.pages} * page_bytes;
  g.page_bytes = page_bytes;
  g.kv_bytes = uint64_t{m.kv_pages} * page_bytes;
  g.emb_bytes = uint64_t{m.emb_pages} * page_bytes;
  g.free_bytes = uint64_t{m.free_pages} * page_bytes;
  g.kv_resident_users = parts_.kv->Stats().users_held;
  const EmbCacheStats e = parts_.emb->GetStats();
  g.emb_resident_rows = e.entries - e.pending_entries;
  if (parts_.refiller != nullptr) {
    g.refill_backlog_bytes = parts_.refiller->GetStats().backlog_rows * parts_.row_bytes;
  }
  absl::MutexLock lock(&mu_);
  g.load = LoadLocked(depth);
  g.in_flight_tokens = in_flight_tokens_;
  g.in_flight_requests = in_flight_requests_;
  g.draining = draining_;
  g.alpha_epoch = alpha_epoch_;
  g.alpha_decision_id = alpha_decision_;
  return g;
}

}  // namespace hlem::serving
