// Faults in the twin (sim/twin/faults.h): seeded schedules of node kills and restarts, checked
// for the invariants the real cluster's fault test checks (tests/e2e/faults_test.sh), and
// replayed exactly from their seed.
#include "sim/twin/faults.h"

#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/twin/twin.h"
#include "sim/twin/twin_testing.h"
#include "sim/workload/workload_testing.h"

namespace hlem::sim {
namespace {

using ::testing::HasSubstr;
using Kind = FaultEvent::Kind;

using testing::Feed;
using testing::Generate;

// The router's view of a node (by value: Nodes() returns a fresh vector).
std::optional<router::NodeStatus> Status(const std::vector<router::NodeStatus>& nodes,
                                         const std::string& id) {
  for (const auto& n : nodes) {
    if (n.id == id) return n;
  }
  return std::nullopt;
}

TEST(FaultPlanTest, ParsesFormatsAndValidates) {
  auto plan = ParseFaultPlan("restart:1@7.5s, kill:1@5s,kill:0@250ms");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[0], (FaultEvent{absl::Milliseconds(250), Kind::kKillNode, 0}));
  EXPECT_EQ((*plan)[2], (FaultEvent{absl::Milliseconds(7500), Kind::kRestartNode, 1}));
  EXPECT_EQ(FormatFaultPlan(*plan), "kill:0@250ms,kill:1@5s,restart:1@7.5s");
  EXPECT_EQ(*ParseFaultPlan(FormatFaultPlan(*plan)), *plan);
  EXPECT_TRUE(ParseFaultPlan("")->empty());
  EXPECT_TRUE(ValidateFaultPlan(*plan, 2).ok());
  EXPECT_THAT(std::string(ValidateFaultPlan(*plan, 1).message()), HasSubstr("kill:1@5s: node 1"));
  EXPECT_THAT(std::string(ParseFaultPlan("stall:1@5s").status().message()),
              HasSubstr("'stall:1@5s'"));
  EXPECT_FALSE(ParseFaultPlan("kill:x@5s").ok());
  EXPECT_FALSE(ParseFaultPlan("kill:1@soon").ok());
  EXPECT_FALSE(ParseFaultPlan("kill:1@-1s").ok());
  EXPECT_THAT(std::string(ValidateFaultPlan(*ParseFaultPlan("restart:0@1s"), 2).message()),
              HasSubstr("not dead"));
  EXPECT_THAT(std::string(ValidateFaultPlan(*ParseFaultPlan("kill:0@1s,kill:0@2s"), 2).message()),
              HasSubstr("already dead"));
}

TEST(FaultPlanTest, RandomPlansAreValidReproducibleAndKeepANodeUp) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const auto plan = RandomFaultPlan(seed, 3, absl::Seconds(20), 6);
    EXPECT_EQ(plan, RandomFaultPlan(seed, 3, absl::Seconds(20), 6));
    ASSERT_TRUE(ValidateFaultPlan(plan, 3).ok()) << seed << ": " << FormatFaultPlan(plan);
    EXPECT_EQ(*ParseFaultPlan(FormatFaultPlan(plan)), plan);  // the printed plan replays it
    int dead = 0;
    for (const FaultEvent& e : plan) {
      dead += e.kind == Kind::kKillNode ? 1 : -1;
      EXPECT_LT(dead, 3) << "every node dead at once, seed " << seed;
      EXPECT_LT(e.at, absl::Seconds(20));
    }
  }
  EXPECT_NE(RandomFaultPlan(1, 3, absl::Seconds(20), 6),
            RandomFaultPlan(2, 3, absl::Seconds(20), 6));
}

// A node killed and restarted by hand: in-flight and misrouted requests fail UNAVAILABLE and are
// retried; the router drops the node after fault_detection and sends it nothing more; the new
// incarnation comes back with a new epoch and none of the old residency.
TEST(TwinFaultTest, KillAndRestartANode) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  TwinOptions options = testing::TinyTwin(workload);
  options.fault_detection = absl::Milliseconds(500);
  auto created = Twin::Create(options, workload);
  ASSERT_TRUE(created.ok()) << created.status();
  Twin& twin = **created;
  ASSERT_TRUE(twin.Start(Feed(trace)).ok());
  twin.RunUntil(absl::Seconds(2));
  const std::optional<router::NodeStatus> before = Status(twin.router().Nodes(), "node-1");
  ASSERT_TRUE(before.has_value());
  EXPECT_GT(before->resident_users, 0u);
  EXPECT_EQ(before->epoch, 1u);
  ASSERT_TRUE(twin.KillNode(1).ok());
  EXPECT_EQ(twin.KillNode(1).code(), absl::StatusCode::kFailedPrecondition);
  twin.RunUntil(absl::Milliseconds(2400));
  EXPECT_EQ(Status(twin.router().Nodes(), "node-1")->index, 1);  // not noticed yet
  twin.RunUntil(absl::Milliseconds(2600));
  EXPECT_FALSE(Status(twin.router().Nodes(), "node-1").has_value());  // noticed, removed
  EXPECT_EQ(twin.router_index(1), -1);
  twin.RunUntil(absl::Seconds(3));
  ASSERT_TRUE(twin.RestartNode(1).ok());
  const std::optional<router::NodeStatus> after = Status(twin.router().Nodes(), "node-1");
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->epoch, 2u);
  EXPECT_EQ(after->resident_users, 0u);  // the old incarnation's residency is gone
  twin.RunUntil(absl::Seconds(4));
  const std::optional<router::NodeStatus> rejoined = Status(twin.router().Nodes(), "node-1");
  ASSERT_TRUE(rejoined.has_value());
  EXPECT_EQ(rejoined->view, router::NodeView::kExact);  // routable, its stream followed
  EXPECT_LT(rejoined->report_age, absl::Seconds(1));
  ASSERT_TRUE(twin.Finish().ok());

  const TwinStats& s = twin.stats();
  EXPECT_EQ(s.kills, 1u);
  EXPECT_EQ(s.restarts, 1u);
  EXPECT_EQ(s.sent_to_dead_after_detection, 0u);
  uint64_t failed = 0;
  for (const TwinOutcome& o : twin.outcomes()) {
    EXPECT_TRUE(o.answered);
    if (o.code != absl::StatusCode::kOk) {
      ++failed;
      EXPECT_EQ(o.code, absl::StatusCode::kUnavailable) << o.message;
    }
  }
  EXPECT_LE(failed, s.killed_in_flight + s.sent_to_dead);
  EXPECT_EQ(failed, 0u) << "three other nodes were up: every failed attempt had a retry";
  EXPECT_TRUE(twin.node(1).kv->CheckInvariants().ok());
}

// Seeded schedules: for each seed the invariants hold, and the run replays exactly. A failure
// prints the seed and the plan: `hlem sim run --faults '<plan>'` replays it.
TEST(TwinFaultTest, SeededSchedulesKeepTheInvariantsAndReplayExactly) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  uint64_t disturbed = 0, retried_ok = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    TwinOptions options = testing::TinyTwin(workload);
    options.nodes = 3;
    options.fault_detection = absl::Milliseconds(300);
    options.faults = RandomFaultPlan(seed, options.nodes, absl::Seconds(5), 4);
    const std::string replay = "seed " + std::to_string(seed) + ", plan --faults '" +
                               FormatFaultPlan(options.faults) + "'";
    uint64_t hash = 0;
    for (int run = 0; run < 2; ++run) {
      auto twin = Twin::Create(options, workload);
      ASSERT_TRUE(twin.ok()) << twin.status();
      ASSERT_TRUE((*twin)->Run(Feed(trace)).ok()) << replay;
      const TwinStats& s = (*twin)->stats();
      ASSERT_EQ((*twin)->outcomes().size(), trace.size()) << replay;
      uint64_t failed = 0;
      for (const TwinOutcome& o : (*twin)->outcomes()) {
        ASSERT_TRUE(o.answered) << replay;
        if (o.code == absl::StatusCode::kOk) continue;
        ++failed;
        EXPECT_EQ(o.code, absl::StatusCode::kUnavailable) << replay << ": " << o.message;
      }
      uint64_t kills = 0;
      for (const FaultEvent& e : options.faults) kills += e.kind == Kind::kKillNode;
      EXPECT_EQ(s.kills, kills) << replay;
      EXPECT_EQ(s.sent_to_dead_after_detection, 0u) << replay;
      EXPECT_LE(failed, s.killed_in_flight + s.sent_to_dead) << replay;
      if (run == 0) {
        hash = s.log_hash;
        disturbed += s.killed_in_flight + s.sent_to_dead;
        retried_ok += s.killed_in_flight + s.sent_to_dead - failed;
      }
      EXPECT_EQ(s.log_hash, hash) << replay << ": not deterministic";
    }
  }
  // The schedules hit traffic: requests in flight at a killed node or sent to a dead one, most
  // of them saved by the retry.
  EXPECT_GT(disturbed, 10u);
  EXPECT_GT(retried_ok, disturbed / 2);
}

}  // namespace
}  // namespace hlem::sim
