// Faults in the twin (sim/twin/faults.h): seeded schedules of node kills and restarts, checked
// for the invariants the real cluster's fault test checks (tests/e2e/faults_test.sh), and
// replayed exactly from their seed.
#include "sim/twin/faults.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/twin/control.h"
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

TEST(FaultPlanTest, TheAllocatorDiesAndComesBack) {
  auto plan = ParseFaultPlan("restart:allocator@4s,kill:allocator@1.5s,kill:0@2s");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[0].kind, Kind::kKillAllocator);
  EXPECT_TRUE((*plan)[0].allocator());
  EXPECT_FALSE((*plan)[1].allocator());
  EXPECT_EQ(FormatFaultPlan(*plan), "kill:allocator@1.5s,kill:0@2s,restart:allocator@4s");
  EXPECT_EQ(*ParseFaultPlan(FormatFaultPlan(*plan)), *plan);
  EXPECT_TRUE(ValidateFaultPlan(*plan, 1).ok());  // the allocator is not a node
  EXPECT_FALSE(AllocatorDownAt(*plan, absl::Seconds(1)));
  EXPECT_TRUE(AllocatorDownAt(*plan, absl::Milliseconds(1500)));
  EXPECT_TRUE(AllocatorDownAt(*plan, absl::Seconds(3)));
  EXPECT_FALSE(AllocatorDownAt(*plan, absl::Seconds(4)));
  EXPECT_THAT(std::string(ValidateFaultPlan(*ParseFaultPlan("restart:allocator@1s"), 2).message()),
              HasSubstr("the allocator is not dead"));
  EXPECT_THAT(
      std::string(
          ValidateFaultPlan(*ParseFaultPlan("kill:allocator@1s,kill:allocator@2s"), 2).message()),
      HasSubstr("already dead"));
  EXPECT_THAT(std::string(ParseFaultPlan("kill:router@1s").status().message()),
              HasSubstr("kill:allocator@TIME"));
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

// The router's retry budget in the twin: the requests a kill disturbs are retried while the
// budget lasts; with an empty budget (no ratio, no floor) none is, and each fails with its
// first attempt's UNAVAILABLE.
TEST(TwinFaultTest, RetriesOfADeadNodesRequestsStayWithinTheBudget) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  for (const bool empty : {false, true}) {
    SCOPED_TRACE(empty ? "empty budget" : "default budget");
    TwinOptions options = testing::TinyTwin(workload);
    options.fault_detection = absl::Milliseconds(500);
    if (empty) options.retry_budget = {.ratio = 0, .min_per_second = 0};
    auto created = Twin::Create(options, workload);
    ASSERT_TRUE(created.ok()) << created.status();
    Twin& twin = **created;
    ASSERT_TRUE(twin.Start(Feed(trace)).ok());
    twin.RunUntil(absl::Seconds(2));
    ASSERT_TRUE(twin.KillNode(1).ok());
    ASSERT_TRUE(twin.Finish().ok());
    const TwinStats& s = twin.stats();
    uint64_t failed = 0;
    for (const TwinOutcome& o : twin.outcomes()) failed += o.code != absl::StatusCode::kOk;
    const uint64_t disturbed = s.killed_in_flight + s.sent_to_dead;
    ASSERT_GT(disturbed, 0u);
    EXPECT_EQ(s.retries + s.retries_over_budget, disturbed);
    EXPECT_EQ(s.retries, empty ? 0 : disturbed);
    EXPECT_EQ(failed, empty ? disturbed : 0);
  }
  TwinOptions bad = testing::TinyTwin(workload);
  bad.retry_budget.ratio = -1;
  EXPECT_EQ(Twin::Create(bad, workload).status().code(), absl::StatusCode::kInvalidArgument);
}

// A controller that counts its own decisions and remembers what it saw: α = 0.1 × its count, so
// every decision changes α and a fresh instance starts again at 0.1.
class CountingController : public allocator::Controller {
 public:
  struct Call {
    size_t history = 0;   // windows it was given
    uint64_t newest = 0;  // the newest one's index
    int count = 0;        // this instance's decisions so far, this one included
  };
  explicit CountingController(std::vector<Call>* calls) : calls_(calls) {}
  std::string name() const override { return "counting"; }
  allocator::Decision Decide(std::span<const allocator::WindowState> history) override {
    ++count_;
    calls_->push_back({history.size(), history.back().index, count_});
    return {.alpha = 0.1 * count_, .reason = allocator::Reason::kHold, .detail = ""};
  }

 private:
  std::vector<Call>* calls_;
  int count_ = 0;
};

struct Controlled {
  std::vector<ControlRecord> records;
  std::vector<CountingController::Call> calls;  // every controller's, in order
  uint64_t undecided = 0;
};

// The windows node `node` was decided on, in order.
std::vector<uint64_t> Decided(const Controlled& c, uint32_t node) {
  std::vector<uint64_t> out;
  for (const ControlRecord& r : c.records) {
    if (r.node == node) out.push_back(r.window);
  }
  return out;
}

// Replays TinyWorkload (5 s; the twin's windows are 1 s) on two nodes with `plan`, a
// CountingController per node incarnation, the decision 1 ms after each window closes.
Controlled RunWithFaults(const std::string& plan) {
  const WorkloadConfig workload = testing::TinyWorkload();
  TwinOptions options = testing::TinyTwin(workload);
  options.nodes = 2;
  options.faults = *ParseFaultPlan(plan);
  auto twin = Twin::Create(options, workload);
  EXPECT_TRUE(twin.ok()) << twin.status();
  Controlled out;
  auto make = [&out]() -> std::unique_ptr<allocator::Controller> {
    return std::make_unique<CountingController>(&out.calls);
  };
  const ControlOptions control{.window = absl::Seconds(1)};
  auto loop = ControlLoop::Create(**twin, make, control);
  EXPECT_TRUE(loop.ok()) << loop.status();
  EXPECT_TRUE((*twin)->Start(Feed(Generate(workload))).ok());
  for (int64_t k = 1; !(*twin)->done(); ++k) {
    (*twin)->RunUntil(control.window * k + control.delay);
    EXPECT_TRUE(loop->Decide(&out.records).ok());
  }
  EXPECT_TRUE((*twin)->Finish().ok());
  out.undecided = loop->undecided_windows();
  return out;
}

TEST(TwinFaultTest, ADeadAllocatorChangesNoAlphaAndARestartedOneStartsOver) {
  const Controlled c = RunWithFaults("kill:allocator@1.5s,restart:allocator@3.5s");
  // Windows 0..4 close at 1..5 s. Window 0 is decided; 1 and 2 close while the allocator is
  // dead; the restarted allocator meets each node with a fresh controller at 4 s: windows 0..2
  // are its history and it decides window 3, then window 4 (and any later one before the last
  // answer).
  for (uint32_t node = 0; node < 2; ++node) {
    const std::vector<uint64_t> decided = Decided(c, node);
    ASSERT_GE(decided.size(), 3u) << "node " << node;
    EXPECT_THAT(std::vector<uint64_t>(decided.begin(), decided.begin() + 3),
                ::testing::ElementsAre(0u, 3u, 4u))
        << "node " << node;
  }
  int fresh_after_restart = 0;
  for (const CountingController::Call& call : c.calls) {
    if (call.newest == 3) {
      EXPECT_EQ(call.count, 1) << "a restarted allocator's controllers are fresh";
      EXPECT_EQ(call.history, 4u) << "windows 0..2 as history, then 3";
      ++fresh_after_restart;
    }
  }
  EXPECT_EQ(fresh_after_restart, 2);
  EXPECT_EQ(c.undecided, 4u);  // windows 1 and 2 of both nodes
}

TEST(TwinFaultTest, ARestartedNodeGetsAFreshControllerForItsNewWindows) {
  const Controlled c = RunWithFaults("kill:1@1.5s,restart:1@2.2s");
  // Node 1's first incarnation closes window 0 (decided at 1 s); the second starts at 2.2 s and
  // closes its window 0 at 3.2 s, decided at 4 s by a fresh controller, then its window 1.
  const std::vector<uint64_t> decided = Decided(c, 1);
  ASSERT_GE(decided.size(), 3u);
  EXPECT_THAT(std::vector<uint64_t>(decided.begin(), decided.begin() + 3),
              ::testing::ElementsAre(0u, 0u, 1u));
  int fresh = 0;
  for (const CountingController::Call& call : c.calls) fresh += call.count == 1 ? 1 : 0;
  EXPECT_EQ(fresh, 3);  // node 0's, node 1's first and second incarnations'
  EXPECT_EQ(c.undecided, 0u);
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

// The tiny twin's tables on `servers` shard servers (range partitioning), for shard faults.
SimShardOptions TinyShards(const WorkloadConfig& workload, const TwinOptions& twin,
                           uint32_t servers, uint32_t replicas, bool dead_refuses) {
  SimShardOptions o;
  for (const FeatureTable& f : workload.features) {
    o.client.tables.push_back(
        {.id = f.table_id, .name = f.name, .rows = f.rows, .dim = twin.node.model.dim});
  }
  o.client.map = {.num_shards = servers, .replicas = replicas};
  o.dead_refuses = dead_refuses;
  return o;
}

// Shard `s` out from 1 s to 3 s: stopped and continued, or killed and restarted.
std::string OutFromOneToThree(int s, bool stop) {
  const std::string shard = "shard" + std::to_string(s);
  return stop ? "stop:" + shard + "@1s,cont:" + shard + "@3s"
              : "kill:" + shard + "@1s,restart:" + shard + "@3s";
}

struct ShardRun {
  std::vector<TwinOutcome> outcomes;
  TwinStats stats;
};

ShardRun RunWithShards(const WorkloadConfig& workload, const std::vector<TraceRequest>& trace,
                       TwinOptions options, const std::string& plan) {
  auto faults = ParseFaultPlan(plan);
  EXPECT_TRUE(faults.ok()) << faults.status();
  options.faults = *faults;
  auto twin = Twin::Create(options, workload);
  EXPECT_TRUE(twin.ok()) << twin.status();
  if (!twin.ok()) return {};
  EXPECT_TRUE((*twin)->Run(Feed(trace)).ok()) << plan;
  EXPECT_EQ((*twin)->outcomes().size(), trace.size());
  for (const TwinOutcome& o : (*twin)->outcomes()) EXPECT_TRUE(o.answered) << plan;
  return {(*twin)->outcomes(), (*twin)->stats()};
}

TEST(FaultPlanTest, ShardEventsParseFormatAndValidate) {
  auto plan = ParseFaultPlan("cont:shard1@4s,stop:shard1@3s,restart:shard0@2s,kill:shard0@1s");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 4u);
  EXPECT_EQ((*plan)[0], (FaultEvent{.at = absl::Seconds(1), .kind = Kind::kKillShard, .shard = 0}));
  EXPECT_EQ((*plan)[3],
            (FaultEvent{.at = absl::Seconds(4), .kind = Kind::kContinueShard, .shard = 1}));
  EXPECT_TRUE((*plan)[2].shard_event());
  EXPECT_FALSE((*plan)[2].allocator());
  EXPECT_EQ(FormatFaultPlan(*plan),
            "kill:shard0@1s,restart:shard0@2s,stop:shard1@3s,cont:shard1@4s");
  EXPECT_EQ(*ParseFaultPlan(FormatFaultPlan(*plan)), *plan);
  EXPECT_TRUE(ValidateFaultPlan(*plan, 1, 2).ok());
  EXPECT_THAT(std::string(ValidateFaultPlan(*plan, 1).message()), HasSubstr("no shard map"));
  EXPECT_THAT(std::string(ValidateFaultPlan(*plan, 1, 1).message()),
              HasSubstr("stop:shard1@3s: shard 1 of 1"));
  auto invalid = [](const std::string& p) {
    return std::string(ValidateFaultPlan(*ParseFaultPlan(p), 1, 2).message());
  };
  EXPECT_THAT(invalid("cont:shard0@1s"), HasSubstr("the shard is serving"));
  EXPECT_THAT(invalid("restart:shard0@1s"), HasSubstr("the shard is serving"));
  EXPECT_THAT(invalid("kill:shard0@1s,stop:shard0@2s"), HasSubstr("the shard is dead"));
  EXPECT_THAT(invalid("stop:shard0@1s,restart:shard0@2s"), HasSubstr("the shard is stopped"));
  EXPECT_THAT(std::string(ParseFaultPlan("stop:1@1s").status().message()),
              HasSubstr("stop:shardS@TIME"));
  EXPECT_FALSE(ParseFaultPlan("kill:shard@1s").ok());
  EXPECT_FALSE(ParseFaultPlan("kill:shardx@1s").ok());
}

TEST(FaultPlanTest, RandomShardPlansAreValidAndReproducible) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const auto plan = RandomShardFaultPlan(seed, 3, absl::Seconds(20), 5);
    EXPECT_EQ(plan, RandomShardFaultPlan(seed, 3, absl::Seconds(20), 5));
    ASSERT_TRUE(ValidateFaultPlan(plan, 1, 3).ok()) << seed << ": " << FormatFaultPlan(plan);
    EXPECT_EQ(*ParseFaultPlan(FormatFaultPlan(plan)), plan);
    for (const FaultEvent& e : plan) EXPECT_TRUE(e.shard_event());
  }
  auto both = FaultPlanFromSpec("random:7:2:3", 3, 3, absl::Seconds(20));
  ASSERT_TRUE(both.ok()) << both.status();
  size_t nodes = 0, shards = 0;
  for (const FaultEvent& e : *both) (e.shard_event() ? shards : nodes) += 1;
  EXPECT_GE(nodes, 2u);
  EXPECT_GE(shards, 3u);
  EXPECT_TRUE(ValidateFaultPlan(*both, 3, 3).ok());
  EXPECT_EQ(*FaultPlanFromSpec("kill:1@1s", 3, 0, absl::Seconds(20)), *ParseFaultPlan("kill:1@1s"));
  EXPECT_THAT(
      std::string(FaultPlanFromSpec("random:7", 3, 3, absl::Seconds(20)).status().message()),
      HasSubstr("random:SEED:KILLS[:SHARD_FAULTS]"));
  EXPECT_FALSE(FaultPlanFromSpec("random:7:2:x", 3, 3, absl::Seconds(20)).ok());
}

// A plan with shard events needs the shards' map; a request deadline must be positive.
TEST(TwinFaultTest, ShardFaultsNeedAShardMap) {
  const WorkloadConfig workload = testing::TinyWorkload();
  TwinOptions options = testing::TinyTwin(workload);
  options.faults = *ParseFaultPlan("stop:shard0@1s");
  auto twin = Twin::Create(options, workload);
  EXPECT_EQ(twin.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(twin.status().message()), HasSubstr("no shard map"));
  options.shards = TinyShards(workload, options, 1, 1, /*dead_refuses=*/true);
  EXPECT_TRUE(Twin::Create(options, workload).ok());
  options.faults = *ParseFaultPlan("stop:shard1@1s");
  EXPECT_THAT(std::string(Twin::Create(options, workload).status().message()),
              HasSubstr("stop:shard1@1s: shard 1 of 1"));
  options.faults.clear();
  options.deadline = absl::ZeroDuration();
  EXPECT_THAT(std::string(Twin::Create(options, workload).status().message()),
              HasSubstr("twin.deadline"));
}

// A shard with a replica killed (gRPC: refused at once) or stopped (no answer: the attempt
// timeout, then the replica): no request fails, the clients fail over.
TEST(TwinFaultTest, AShardWithAReplicaFailsOverAndNoRequestFails) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  for (const bool stop : {false, true}) {
    TwinOptions options = testing::TinyTwin(workload);
    options.shards = TinyShards(workload, options, 2, 2, /*dead_refuses=*/true);
    const std::string plan = OutFromOneToThree(0, stop);
    const ShardRun run = RunWithShards(workload, trace, options, plan);
    uint64_t slow = 0;
    for (const TwinOutcome& o : run.outcomes) {
      EXPECT_EQ(o.code, absl::StatusCode::kOk) << plan << ": " << o.message;
      slow += o.fetch_ns >= 250'000'000;
    }
    EXPECT_EQ(run.stats.shard_events, 2u);
    EXPECT_GT(run.stats.shard_fetches.failovers, 0u) << plan;
    EXPECT_EQ(run.stats.shard_fetches.unavailable + run.stats.shard_fetches.deadline_exceeded, 0u);
    if (stop) {
      EXPECT_GT(slow, 0u) << "a stopped shard costs the attempt timeout";
    } else {
      EXPECT_EQ(slow, 0u) << "a refused connection fails over at once";
    }
    // Deterministic: the same plan gives the same log.
    EXPECT_EQ(RunWithShards(workload, trace, options, plan).stats.log_hash, run.stats.log_hash);
  }
}

// Without a replica: the requests that need the dead or stopped shard fail UNAVAILABLE (a stopped
// one first costs them their deadline, until the clients mark it down), the others are served,
// and once it is back and probed every request succeeds again.
TEST(TwinFaultTest, WithoutAReplicaOnlyTheRequestsThatNeedTheShardFail) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  for (const bool stop : {false, true}) {
    TwinOptions options = testing::TinyTwin(workload);
    options.shards = TinyShards(workload, options, 2, 1, /*dead_refuses=*/true);
    options.deadline = absl::Milliseconds(300);
    const std::string plan = OutFromOneToThree(1, stop);
    const ShardRun run = RunWithShards(workload, trace, options, plan);
    uint64_t failed = 0, served_during = 0;
    for (const TwinOutcome& o : run.outcomes) {
      const absl::Duration sent = absl::Nanoseconds(static_cast<int64_t>(o.sent_ns));
      if (o.code == absl::StatusCode::kOk) {
        served_during += sent > absl::Seconds(1) && sent < absl::Seconds(3);
        continue;
      }
      ++failed;
      // A fetch that waits on a stopped shard until the deadline: the client has
      // DEADLINE_EXCEEDED then, before the node's UNAVAILABLE reaches it.
      if (o.code == absl::StatusCode::kDeadlineExceeded && stop) continue;
      EXPECT_EQ(o.code, absl::StatusCode::kUnavailable) << plan << ": " << o.message;
      EXPECT_THAT(o.message, HasSubstr("rows of table")) << plan;
      // Only while the shard was out (until the clients' next probe after it came back).
      EXPECT_GT(sent, absl::Seconds(1) - absl::Milliseconds(300)) << plan;
      EXPECT_LT(sent, absl::Seconds(3) + absl::Milliseconds(500)) << plan;
    }
    EXPECT_GT(failed, 10u) << plan;
    EXPECT_GT(served_during, 0u) << plan << ": requests that need only shard 0 are served";
    const SimShards::Counters& c = run.stats.shard_fetches;
    EXPECT_GT(c.unavailable, 0u) << plan;
    if (stop) {
      EXPECT_GT(c.deadline_exceeded, 0u) << "the first fetches wait for their deadline";
    } else {
      EXPECT_EQ(c.deadline_exceeded, 0u) << "a refused connection fails at once";
    }
  }
}

// Seeded shard schedules (kills and stops of shards with one replica each, several down at once
// at times): every request has one outcome, failures are UNAVAILABLE and only while a shard was
// out, and the run replays exactly.
TEST(TwinFaultTest, SeededShardSchedulesKeepTheInvariantsAndReplayExactly) {
  const WorkloadConfig workload = testing::TinyWorkload();
  const std::vector<TraceRequest> trace = Generate(workload);
  uint64_t failovers = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    TwinOptions options = testing::TinyTwin(workload);
    options.nodes = 3;
    options.shards = TinyShards(workload, options, 3, 2, /*dead_refuses=*/seed % 2 == 0);
    options.deadline = absl::Milliseconds(500);
    auto plan = FaultPlanFromSpec("random:" + std::to_string(seed) + ":0:4", options.nodes, 3,
                                  absl::Seconds(5));
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::string spec = FormatFaultPlan(*plan);
    const std::string replay = "seed " + std::to_string(seed) + ", plan --faults '" + spec + "'";
    // When some shard was out: from its fault to its return plus a probe interval.
    std::vector<std::pair<absl::Duration, absl::Duration>> out;
    std::map<uint32_t, size_t> open;  // shard -> its outage in `out`
    for (const FaultEvent& e : *plan) {
      if (e.kind == Kind::kKillShard || e.kind == Kind::kStopShard) {
        open[e.shard] = out.size();
        out.push_back({e.at, absl::InfiniteDuration()});
      } else {
        out[open.at(e.shard)].second = e.at + absl::Milliseconds(500);
      }
    }
    const ShardRun run = RunWithShards(workload, trace, options, spec);
    for (const TwinOutcome& o : run.outcomes) {
      if (o.code == absl::StatusCode::kOk) continue;
      // UNAVAILABLE from the node, or the client's deadline while a fetch waited on a stopped
      // shard.
      EXPECT_TRUE(o.code == absl::StatusCode::kUnavailable ||
                  o.code == absl::StatusCode::kDeadlineExceeded)
          << replay << ": " << o.code << " " << o.message;
      const absl::Duration sent = absl::Nanoseconds(static_cast<int64_t>(o.sent_ns));
      EXPECT_TRUE(std::any_of(out.begin(), out.end(),
                              [&](const auto& w) {
                                return sent + absl::Milliseconds(500) >= w.first &&
                                       sent <= w.second;
                              }))
          << replay << ": request sent at " << sent << " failed with no shard out: " << o.message;
    }
    failovers += run.stats.shard_fetches.failovers;
    EXPECT_EQ(RunWithShards(workload, trace, options, spec).stats.log_hash, run.stats.log_hash)
        << replay << ": not deterministic";
  }
  EXPECT_GT(failovers, 0u);
}

}  // namespace
}  // namespace hlem::sim
