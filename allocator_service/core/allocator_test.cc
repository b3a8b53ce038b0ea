#include "allocator_service/core/allocator.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator_service/core/allocator_testing.h"

namespace hlem::allocator {
namespace {

using allocator::testing::FakeNodes;
using allocator::testing::IndexController;

struct Harness {
  SimClock clock{absl::UnixEpoch()};
  FakeNodes nodes{clock, absl::Seconds(5)};
  std::deque<std::vector<uint64_t>> made;   // per controller made: the windows it saw
  std::deque<std::vector<size_t>> lengths;  // and the history lengths it was given
  std::unique_ptr<Allocator> allocator;

  explicit Harness(int n, AllocatorOptions options = {.epoch = 7, .allocator_id = "alloc-a"}) {
    allocator = *Allocator::Create(options, nodes, clock, [this] {
      made.emplace_back();
      lengths.emplace_back();
      return std::make_unique<IndexController>(&made.back(), &lengths.back());
    });
    for (int i = 0; i < n; ++i) Add(absl::StrCat("10.0.0.", i, ":7001"));
  }
  void Add(const std::string& address) {
    nodes.Add(address);
    allocator->AddNode({.address = address, .admin_address = address + "-admin"});
  }
  // Advances to 1 ms after the next window closes, then runs a round.
  RoundStats Round() {
    clock.AdvanceTo(absl::UnixEpoch() +
                    absl::Seconds(5) * (static_cast<int64_t>(nodes.Closed(0)) + 1) +
                    absl::Milliseconds(1));
    return allocator->RunRound();
  }
};

TEST(AllocatorTest, DecidesEachNewWindowAndPushesWithEpochAndGrowingIds) {
  Harness h(3);
  RoundStats r = h.Round();  // window 0 closed
  EXPECT_EQ(r.nodes, 3u);
  EXPECT_EQ(r.decisions, 3u);
  EXPECT_EQ(r.pushes, 3u);
  for (int k = 0; k < 4; ++k) h.Round();
  uint64_t last_id = 0;
  for (const NodeApi::Push& p : h.nodes.pushes) {
    EXPECT_EQ(p.allocator_epoch, 7u);
    EXPECT_EQ(p.allocator_id, "alloc-a");
    EXPECT_GT(p.decision_id, last_id);
    last_id = p.decision_id;
  }
  EXPECT_EQ(h.nodes.pushes.size(), 15u);
  EXPECT_NEAR(h.nodes.at("10.0.0.1:7001").alpha, 0.14, 1e-12);  // window 4
  ASSERT_EQ(h.made.size(), 3u);
  EXPECT_EQ(h.made[0], (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  for (const NodeStatus& s : h.allocator->Nodes()) {
    EXPECT_TRUE(s.reachable);
    EXPECT_FALSE(s.pending);
    EXPECT_NEAR(s.alpha, 0.14, 1e-12);
    EXPECT_EQ(s.last.window_index, 4u);
    EXPECT_TRUE(s.last.applied);
    EXPECT_EQ(s.last.reason, Reason::kPolicy);
  }
  // A round before the next window closes decides nothing and pushes nothing.
  r = h.allocator->RunRound();
  EXPECT_EQ(r.decisions, 0u);
  EXPECT_EQ(r.pushes, 0u);
  EXPECT_EQ(r.no_new_window, 3u);
}

TEST(AllocatorTest, AnUnansweringNodeKeepsItsAlphaAndCatchesUpInOrder) {
  Harness h(2);
  h.Round();
  h.Round();  // windows 0, 1: α 0.11
  FakeNodes::Node& down = h.nodes.at("10.0.0.0:7001");
  down.fail_state = true;
  RoundStats r = h.Round();
  EXPECT_EQ(r.poll_failed, 1u);
  EXPECT_EQ(down.set_calls, 2);  // nothing pushed to it
  EXPECT_NEAR(down.alpha, 0.11, 1e-12);
  bool gap = false;
  std::vector<DecisionRecord> held = h.allocator->Decisions("", 10, 0, &gap);
  ASSERT_FALSE(held.empty());
  const DecisionRecord* hold = nullptr;
  for (const DecisionRecord& d : held) {
    if (d.no_state) hold = &d;
  }
  ASSERT_NE(hold, nullptr);
  EXPECT_EQ(hold->decision_id, 0u);
  EXPECT_NE(hold->detail.find("UNAVAILABLE"), std::string::npos) << hold->detail;
  h.Round();
  down.fail_state = false;
  r = h.Round();  // windows 2, 3, 4 are new for it: decided in order, one push (window 4)
  EXPECT_EQ(h.made[0], (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(down.set_calls, 3);
  EXPECT_NEAR(down.alpha, 0.14, 1e-12);
}

TEST(AllocatorTest, AFailedPushIsRetriedUntilTakenWithTheSameDecisionId) {
  Harness h(1);
  FakeNodes::Node& n = h.nodes.at("10.0.0.0:7001");
  n.fail_push = true;
  h.Round();
  EXPECT_NEAR(n.alpha, 0.5, 1e-12);  // kept its α
  std::vector<NodeStatus> s = h.allocator->Nodes();
  EXPECT_NEAR(s[0].alpha, 0.5, 1e-12);  // the node's own α, as its window reported it
  EXPECT_NEAR(s[0].last.alpha_before, 0.5, 1e-12);
  EXPECT_TRUE(s[0].pending);
  EXPECT_FALSE(s[0].reachable);
  EXPECT_FALSE(s[0].last.applied);
  EXPECT_NE(s[0].last.apply_error.find("DEADLINE_EXCEEDED"), std::string::npos);
  n.fail_push = false;
  RoundStats r = h.allocator->RunRound();  // no new window: the retry alone
  EXPECT_EQ(r.decisions, 0u);
  EXPECT_EQ(r.pushes, 1u);
  ASSERT_EQ(h.nodes.pushes.size(), 2u);
  EXPECT_EQ(h.nodes.pushes[0].decision_id, h.nodes.pushes[1].decision_id);
  EXPECT_NEAR(n.alpha, 0.10, 1e-12);
  s = h.allocator->Nodes();
  EXPECT_FALSE(s[0].pending);
  EXPECT_EQ(h.allocator->counters().push_failures, 1u);
}

TEST(AllocatorTest, ARestartedNodeGetsAFreshControllerThatDecidesOnlyTheNewestWindow) {
  Harness h(1);
  for (int k = 0; k < 3; ++k) h.Round();
  FakeNodes::Node& n = h.nodes.at("10.0.0.0:7001");
  n.incarnation = 2;
  n.opened_at_window = h.nodes.Closed(0);  // its windows restart at 0
  n.alpha = 0.5;
  for (int k = 0; k < 3; ++k) h.Round();  // the new incarnation closes windows 0, 1, 2
  ASSERT_EQ(h.made.size(), 2u);
  EXPECT_EQ(h.made[0], (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(h.made[1], (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(h.allocator->counters().incarnations, 2u);
  EXPECT_EQ(h.allocator->Nodes()[0].incarnation, 2u);
  // A node the allocator meets late: only its newest window is decided on.
  h.Round();
  h.Add("10.0.0.9:7001");
  h.nodes.at("10.0.0.9:7001").opened_at_window = 0;  // it has run since the start
  h.Round();
  ASSERT_EQ(h.made.size(), 3u);
  EXPECT_EQ(h.made[2], (std::vector<uint64_t>{h.nodes.Closed(0) - 1}));
  // Its older windows (the fakes return 8) are the controller's history.
  EXPECT_EQ(h.lengths[2], (std::vector<size_t>{8}));
  EXPECT_EQ(h.lengths[0], (std::vector<size_t>{1, 2, 3}));
}

TEST(AllocatorTest, RemovedNodesAreNotPolledAndDecisionsCanBeFollowed) {
  Harness h(2, {.epoch = 1, .keep_decisions = 5});
  h.Round();
  h.allocator->RemoveNode("10.0.0.1:7001");
  h.allocator->RemoveNode("10.0.0.1:7001");  // idempotent
  const int calls = h.nodes.at("10.0.0.1:7001").state_calls;
  for (int k = 0; k < 5; ++k) h.Round();
  EXPECT_EQ(h.nodes.at("10.0.0.1:7001").state_calls, calls);
  EXPECT_EQ(h.allocator->Nodes().size(), 1u);
  bool gap = false;
  std::vector<DecisionRecord> last = h.allocator->Decisions("", 100, 0, &gap);
  EXPECT_EQ(last.size(), 5u);  // kept
  EXPECT_FALSE(gap);
  std::vector<DecisionRecord> after = h.allocator->Decisions("node-0", 2, 1, &gap);
  EXPECT_TRUE(gap);  // ids 1..2 were dropped
  ASSERT_EQ(after.size(), 2u);
  EXPECT_LT(after[0].decision_id, after[1].decision_id);
  EXPECT_TRUE(h.allocator->Decisions("node-7", 100, 0, &gap).empty());
}

TEST(AllocatorTest, RoundsWaitForAnswersFromOtherThreads) {
  Harness h(64);
  h.nodes.threaded = true;
  RoundStats r = h.Round();
  EXPECT_EQ(r.polled_ok, 64u);
  EXPECT_EQ(r.decisions, 64u);
  EXPECT_EQ(r.pushes, 64u);
  EXPECT_EQ(r.push_failed, 0u);
  for (const NodeStatus& s : h.allocator->Nodes()) EXPECT_NEAR(s.alpha, 0.10, 1e-12);
}

TEST(AllocatorTest, BadOptionsAreRefused) {
  SimClock clock;
  FakeNodes nodes(clock, absl::Seconds(5));
  auto make = [] { return MakeStatic(0.5); };
  EXPECT_FALSE(Allocator::Create({.epoch = 0}, nodes, clock, make).ok());
  EXPECT_FALSE(Allocator::Create({.interval = absl::ZeroDuration()}, nodes, clock, make).ok());
  EXPECT_FALSE(Allocator::Create({.keep_decisions = 0}, nodes, clock, make).ok());
  EXPECT_FALSE(Allocator::Create({}, nodes, clock, nullptr).ok());
}

// Learn (the adapter's training) runs once per Decide, after the α it decided was pushed.
class LearnLog final : public Controller {
 public:
  LearnLog(FakeNodes& nodes, std::string address, std::vector<std::string>& log)
      : nodes_(nodes), address_(std::move(address)), log_(log) {}
  std::string name() const override { return "learn-log"; }
  Decision Decide(std::span<const WindowState> h) override {
    decided_ = 0.2 + 0.01 * static_cast<double>(h.back().index);
    log_.push_back(absl::StrCat("decide ", h.back().index));
    return {.alpha = decided_, .reason = Reason::kPolicy};
  }
  void Learn() override {
    log_.push_back(absl::StrCat("learn applied=", nodes_.at(address_).alpha == decided_));
  }

 private:
  FakeNodes& nodes_;
  const std::string address_;
  std::vector<std::string>& log_;
  double decided_ = 0;
};

TEST(AllocatorTest, LearnRunsOncePerDecisionAfterItsPush) {
  SimClock clock{absl::UnixEpoch()};
  FakeNodes nodes{clock, absl::Seconds(5)};
  std::vector<std::string> log;
  const std::string address = "10.0.0.1:7001";
  auto allocator = *Allocator::Create(
      {.epoch = 7}, nodes, clock, [&] { return std::make_unique<LearnLog>(nodes, address, log); });
  nodes.Add(address);
  allocator->AddNode({.address = address, .admin_address = address + "-admin"});
  clock.AdvanceTo(absl::UnixEpoch() + absl::Seconds(5) + absl::Milliseconds(1));
  allocator->RunRound();
  // Three windows close before the next round: the first two are decided (and learnt from)
  // without a push, the last is pushed and then learnt from.
  clock.AdvanceTo(absl::UnixEpoch() + absl::Seconds(20) + absl::Milliseconds(1));
  allocator->RunRound();
  EXPECT_EQ(log, (std::vector<std::string>{"decide 0", "learn applied=1", "decide 1",
                                           "learn applied=0", "decide 2", "learn applied=0",
                                           "decide 3", "learn applied=1"}));
}

}  // namespace
}  // namespace hlem::allocator
