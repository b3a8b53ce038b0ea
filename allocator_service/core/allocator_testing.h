#pragma once
// Tests only: fake serving nodes for the allocator's loop (NodeApi on a simulated clock) and a
// controller whose α is a function of the window index.

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator_service/core/allocator.h"
#include "common/clock.h"

namespace hlem::allocator::testing {

// Fake serving nodes on a simulated clock: each closes a window every `window`; GetState returns
// the last 8; SetAlpha keeps the last accepted (epoch, decision id) as a node does. Answers
// inline, or from a thread of its own (threaded = true).
class FakeNodes final : public NodeApi {
 public:
  struct Node {
    std::string id;
    uint64_t incarnation = 1;
    uint64_t opened_at_window = 0;  // the clock's window count when this incarnation started
    double alpha = 0.5;
    uint64_t epoch = 0, decision = 0;
    int set_calls = 0, state_calls = 0;
    bool fail_state = false, fail_push = false;
  };
  FakeNodes(SimClock& clock, absl::Duration window) : clock_(clock), window_(window) {}
  ~FakeNodes() override {
    for (std::thread& t : threads_) t.join();
  }

  Node& Add(const std::string& address) {
    Node& n = nodes_[address];
    n.id = absl::StrCat("node-", nodes_.size() - 1);
    n.opened_at_window = Closed(0);
    return n;
  }
  Node& at(const std::string& address) { return nodes_.at(address); }
  // Windows closed since the start of time (index in the clock's frame).
  uint64_t Closed(uint64_t) const {
    return static_cast<uint64_t>((clock_.Now() - absl::UnixEpoch()) / window_);
  }

  void GetState(const std::string& address, absl::Duration,
                std::function<void(absl::StatusOr<State>)> done) override {
    Node& n = nodes_.at(address);
    ++n.state_calls;
    if (n.fail_state)
      return Answer(std::move(done), absl::StatusOr<State>(absl::UnavailableError("node down")));
    State s{.node_id = n.id, .incarnation = n.incarnation};
    const uint64_t closed = Closed(0) - n.opened_at_window;  // windows of this incarnation
    for (uint64_t i = closed > 8 ? closed - 8 : 0; i < closed; ++i) {
      s.windows.push_back({.index = i,
                           .requests = 100,
                           .hot_user_ratio = 0.3,
                           .alpha = n.alpha,
                           .p99_seconds = 0.020,
                           .slo_seconds = 0.025});
    }
    Answer(std::move(done), absl::StatusOr<State>(std::move(s)));
  }

  void SetAlpha(const std::string& admin, const Push& push, absl::Duration,
                std::function<void(absl::StatusOr<Applied>)> done) override {
    Node& n = nodes_.at(admin.substr(0, admin.find("-admin")));
    ++n.set_calls;
    pushes.push_back(push);
    if (n.fail_push)
      return Answer(std::move(done), absl::StatusOr<Applied>(absl::DeadlineExceededError("slow")));
    n.alpha = push.alpha;
    n.epoch = push.allocator_epoch;
    n.decision = push.decision_id;
    Answer(std::move(done), absl::StatusOr<Applied>(Applied{push.alpha, n.incarnation}));
  }

  bool threaded = false;
  std::vector<Push> pushes;

 private:
  template <typename T>
  void Answer(std::function<void(T)> done, T value) {
    if (!threaded) return done(std::move(value));
    threads_.emplace_back(
        [done = std::move(done), value = std::move(value)]() mutable { done(std::move(value)); });
  }
  SimClock& clock_;
  const absl::Duration window_;
  std::map<std::string, Node> nodes_;
  std::vector<std::thread> threads_;
};

// α = 0.1 + 0.01 × the window's index; logs the windows it saw where the test can read them
// after the allocator dropped it.
class IndexController final : public Controller {
 public:
  // `history` (may be null) gets the length of the history of each call.
  explicit IndexController(std::vector<uint64_t>* seen, std::vector<size_t>* history = nullptr)
      : seen_(*seen), history_(history) {}
  std::string name() const override { return "index"; }
  Decision Decide(std::span<const WindowState> h) override {
    seen_.push_back(h.back().index);
    if (history_ != nullptr) history_->push_back(h.size());
    return {.alpha = 0.1 + 0.01 * static_cast<double>(h.back().index),
            .reason = Reason::kPolicy,
            .detail = "index"};
  }

 private:
  std::vector<uint64_t>& seen_;
  std::vector<size_t>* history_;
};

}  // namespace hlem::allocator::testing
