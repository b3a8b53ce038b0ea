#include "allocator_service/core/allocator.h"

#include <algorithm>
#include <optional>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace hlem::allocator {
namespace {

// Waits until `n` calls have answered. (Not absl::BlockingCounter: the sanitizer builds swap
// absl::Mutex for an instrumented stand-in that the compiled abseil library does not share.)
class Answers {
 public:
  explicit Answers(size_t n) : left_(n) {}
  void One() {
    absl::MutexLock lock(&mu_);
    --left_;
  }
  void Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](size_t* left) { return *left == 0; }, &left_));
  }

 private:
  absl::Mutex mu_;
  size_t left_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Allocator>> Allocator::Create(const AllocatorOptions& options,
                                                             NodeApi& nodes, Clock& clock,
                                                             ControllerFactory make) {
  if (options.epoch == 0) return absl::InvalidArgumentError("allocator: epoch must be > 0");
  if (options.interval <= absl::ZeroDuration() || options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("allocator: interval and rpc_timeout must be positive");
  }
  if (options.max_history == 0 || options.keep_decisions == 0) {
    return absl::InvalidArgumentError("allocator: max_history and keep_decisions must be > 0");
  }
  if (!make) return absl::InvalidArgumentError("allocator: no controller factory");
  return std::unique_ptr<Allocator>(new Allocator(options, nodes, clock, std::move(make)));
}

void Allocator::AddNode(const NodeRef& ref) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Node>& n = nodes_[ref.address];
  if (n == nullptr) n = std::make_shared<Node>();
  n->ref = ref;
}

void Allocator::RemoveNode(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(address);
  if (it == nodes_.end()) return;
  it->second->removed = true;
  nodes_.erase(it);
}

void Allocator::Record(DecisionRecord r) {
  decisions_.push_back(std::move(r));
  while (decisions_.size() > options_.keep_decisions) {
    dropped_after_ = std::max(dropped_after_, decisions_.front().decision_id);
    decisions_.pop_front();
  }
}

RoundStats Allocator::RunRound() {
  absl::MutexLock round(&round_mu_);
  const absl::Time t0 = clock_.Now();
  std::vector<std::shared_ptr<Node>> nodes;
  RoundStats stats;
  {
    absl::MutexLock lock(&mu_);
    stats.round = ++counters_.rounds;
    for (const auto& [address, n] : nodes_) nodes.push_back(n);
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const auto& a, const auto& b) { return a->ref.address < b->ref.address; });
  stats.nodes = nodes.size();

  // 1. Poll every node at once.
  std::vector<std::optional<absl::StatusOr<NodeApi::State>>> states(nodes.size());
  {
    Answers answered(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      api_.GetState(nodes[i]->ref.address, options_.rpc_timeout,
                    [&states, &answered, i](absl::StatusOr<NodeApi::State> s) {
                      states[i] = std::move(s);
                      answered.One();
                    });
    }
    answered.Wait();
  }

  // 2. Decide on every new window, node by node (the controllers are per node).
  std::vector<std::vector<DecisionRecord>> records(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node& n = *nodes[i];
    const absl::StatusOr<NodeApi::State>& s = *states[i];
    absl::MutexLock lock(&mu_);
    if (n.removed) continue;
    if (!s.ok()) {
      ++stats.poll_failed;
      ++counters_.poll_failures;
      n.reachable = false;
      records[i].push_back({.node_id = n.node_id,
                            .address = n.ref.address,
                            .decided_at = clock_.Now(),
                            .window_index = n.next_window > 0 ? n.next_window - 1 : 0,
                            .alpha_before = n.alpha,
                            .alpha_after = n.alpha,
                            .no_state = true,
                            .detail = absl::StrCat("GetState failed (α held): ",
                                                   absl::StatusCodeToString(s.status().code()),
                                                   ": ", s.status().message())});
      continue;
    }
    ++stats.polled_ok;
    n.reachable = true;
    const std::vector<WindowState>& windows = s->windows;
    if (!n.known || s->incarnation != n.incarnation) {
      // A new node or a restarted one: a fresh controller; the windows it already closed are its
      // history, and only the newest is decided on.
      n.known = true;
      n.node_id = s->node_id;
      n.incarnation = s->incarnation;
      n.controller = make_();
      n.learn_pending = false;
      n.history.clear();
      n.pending = false;
      n.next_window = windows.empty() ? 0 : windows.back().index;
      for (const WindowState& w : windows) {
        if (w.index < n.next_window) n.history.push_back(w);
      }
      while (n.history.size() + 1 > options_.max_history && !n.history.empty()) {
        n.history.pop_front();
      }
      n.pushed = false;
      ++counters_.incarnations;
    }
    bool decided = false;
    for (const WindowState& w : windows) {
      if (w.index < n.next_window) continue;
      n.next_window = w.index + 1;
      if (!n.pushed) n.alpha = w.alpha;  // until a push is taken, the node's own α
      n.history.push_back(w);
      while (n.history.size() > options_.max_history) n.history.pop_front();
      const std::vector<WindowState> h(n.history.begin(), n.history.end());
      if (n.learn_pending) n.controller->Learn();  // an earlier window of this round
      const absl::Time c0 = clock_.Now();          // the service's clock is the wall clock
      Decision d = n.controller->Decide(std::span<const WindowState>(h));
      n.learn_pending = true;
      const absl::Duration latency = clock_.Now() - c0;
      const uint64_t id = next_decision_id_++;
      records[i].push_back({.decision_id = id,
                            .node_id = n.node_id,
                            .address = n.ref.address,
                            .decided_at = clock_.Now(),
                            .window_index = w.index,
                            .alpha_before = n.pending ? n.pending_alpha : n.alpha,
                            .alpha_after = d.alpha,
                            .reason = d.reason,
                            .detail = std::move(d.detail),
                            .latency_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(latency)),
                            .reward = Reward(w),
                            .observed = w});
      n.pending_alpha = d.alpha;
      n.pending_id = id;
      n.pending = true;
      decided = true;
      ++stats.decisions;
      ++counters_.decisions;
    }
    if (!decided) ++stats.no_new_window;
  }

  // 3. Push every α not yet taken (this round's decisions and earlier failed pushes).
  std::vector<std::optional<absl::StatusOr<NodeApi::Applied>>> applied(nodes.size());
  std::vector<size_t> pushing;
  std::vector<NodeApi::Push> pushes;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = *nodes[i];
      if (n.removed || !n.pending || !states[i]->ok()) continue;
      pushing.push_back(i);
      pushes.push_back({.alpha = n.pending_alpha,
                        .allocator_epoch = options_.epoch,
                        .decision_id = n.pending_id,
                        .allocator_id = options_.allocator_id});
    }
  }
  {
    Answers answered(pushing.size());
    for (size_t k = 0; k < pushing.size(); ++k) {
      const size_t i = pushing[k];
      api_.SetAlpha(nodes[i]->ref.admin_address, pushes[k], options_.rpc_timeout,
                    [&applied, &answered, i](absl::StatusOr<NodeApi::Applied> a) {
                      applied[i] = std::move(a);
                      answered.One();
                    });
    }
    answered.Wait();
  }
  stats.pushes = pushing.size();

  {
    absl::MutexLock lock(&mu_);
    counters_.pushes += pushing.size();
    for (size_t i = 0; i < nodes.size(); ++i) {
      Node& n = *nodes[i];
      if (applied[i].has_value()) {
        const absl::StatusOr<NodeApi::Applied>& a = *applied[i];
        if (a.ok()) {
          n.alpha = n.pending_alpha;
          n.pending = false;
          n.pushed = true;
        } else {
          n.reachable = false;
          ++stats.push_failed;
          ++counters_.push_failures;
        }
        if (!records[i].empty()) {
          DecisionRecord& r = records[i].back();
          r.applied = a.ok();
          if (!a.ok()) {
            r.apply_error = absl::StrCat(absl::StatusCodeToString(a.status().code()), ": ",
                                         a.status().message());
          }
        }
      }
      if (n.removed) continue;
      for (DecisionRecord& r : records[i]) {
        if (r.decision_id != 0) {
          n.has_decision = true;
          n.last = r;
        }
        Record(std::move(r));
      }
    }
    stats.wall = clock_.Now() - t0;
  }
  // 4. The controllers' slow work (the online adapter's training), after the pushes: off the
  // decision path. Only this round thread touches a node's controller, so no lock is held.
  for (const std::shared_ptr<Node>& n : nodes) {
    if (!n->learn_pending) continue;
    n->learn_pending = false;
    n->controller->Learn();
  }
  stats.learn = clock_.Now() - t0 - stats.wall;
  return stats;
}

std::vector<NodeStatus> Allocator::Nodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<NodeStatus> out;
  for (const auto& [address, n] : nodes_) {
    out.push_back({.ref = n->ref,
                   .node_id = n->node_id,
                   .incarnation = n->incarnation,
                   .alpha = n->alpha,
                   .reachable = n->reachable,
                   .pending = n->pending,
                   .last_window = n->next_window > 0 ? n->next_window - 1 : 0,
                   .has_decision = n->has_decision,
                   .last = n->last});
  }
  std::sort(out.begin(), out.end(),
            [](const NodeStatus& a, const NodeStatus& b) { return a.ref.address < b.ref.address; });
  return out;
}

std::vector<DecisionRecord> Allocator::Decisions(const std::string& node_id, size_t max,
                                                 uint64_t after, bool* gap) const {
  absl::MutexLock lock(&mu_);
  if (gap != nullptr) *gap = after > 0 && after < dropped_after_;
  std::vector<DecisionRecord> out;
  auto wanted = [&](const DecisionRecord& r) {
    return (node_id.empty() || r.node_id == node_id) && (after == 0 || r.decision_id > after);
  };
  if (after == 0) {
    for (auto it = decisions_.rbegin(); it != decisions_.rend() && out.size() < max; ++it) {
      if (wanted(*it)) out.push_back(*it);
    }
    std::reverse(out.begin(), out.end());
  } else {
    for (const DecisionRecord& r : decisions_) {
      if (out.size() >= max) break;
      if (wanted(r)) out.push_back(r);
    }
  }
  return out;
}

AllocatorCounters Allocator::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

}  // namespace hlem::allocator
