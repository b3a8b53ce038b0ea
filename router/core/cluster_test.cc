#include "router/core/cluster.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/shed.h"
#include "gtest/gtest.h"

namespace hlem::router {
namespace {

using serving::ResidencyEvent;
using Kind = ResidencyEvent::Kind;

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override { Build({}); }
  void Build(ClusterOptions o) {
    o.features = {{.table_id = 0, .residency_shard_rows = 100}};
    o.scorer = {.c_kv = 2, .c_emb = 1, .c_load = 1, .epsilon = o.scorer.epsilon};
    cluster_ = *Cluster::Create(o, clock_);
    for (int i = 0; i < 3; ++i) {
      nodes_[i] = *cluster_->AddNode(absl::StrCat("n", i), absl::StrCat("addr", i));
      cluster_->Reset(nodes_[i], {.epoch = 100 + static_cast<uint64_t>(i), .load = {.load = 0.1}});
      seq_[i] = 0;
    }
  }
  absl::Status Event(int i, ResidencyEvent e) {
    e.epoch = 100 + static_cast<uint64_t>(i);
    e.seq = ++seq_[i];
    return cluster_->Apply(nodes_[i], e);
  }
  // A user whose history is items in [0, 100): residency shard 0.
  std::vector<uint64_t> History() { return {1, 2, 3, 50, 99}; }

  SimClock clock_;
  std::unique_ptr<Cluster> cluster_;
  int nodes_[3];
  uint64_t seq_[3];
};

TEST_F(ClusterTest, ReturningUserGoesToItsKvAndEmbLocalityCounts) {
  // Node 2 holds residency shard 0; node 1 holds user 7's K/V.
  ASSERT_TRUE(Event(2, {.kind = Kind::kEmbShardResident, .table_id = 0, .shard = 0}).ok());
  ASSERT_TRUE(Event(1, {.kind = Kind::kKvStored, .user_id = 7, .tokens = 5}).ok());
  RouteResult r = cluster_->Route(7, History(), false);
  EXPECT_EQ(r.node_id, "n1");  // 0.5 (KV) + 0.25·0.9 > 0.25 (EMB) + 0.25·0.9
  EXPECT_EQ(r.decision.h_kv, 1.0);
  EXPECT_EQ(r.decision.best_h_emb, 1.0);
  cluster_->Completed(r.decision.node);
  // A new user with the same items goes where its embeddings are.
  r = cluster_->Route(8, History(), false);
  EXPECT_EQ(r.node_id, "n2");
  EXPECT_EQ(r.decision.h_emb, 1.0);
  cluster_->Completed(r.decision.node);
  // ... and is now speculatively resident there: it comes back to n2 before any event.
  r = cluster_->Route(8, History(), false);
  EXPECT_EQ(r.node_id, "n2");
  EXPECT_EQ(r.decision.h_kv, 1.0);
  cluster_->Completed(r.decision.node);
}

TEST_F(ClusterTest, HEmbCountsProfileShardsOrTheirEvents) {
  // Six events in shard 0, two in shard 1, one in shard 2; node 0 holds shard 0, node 1 holds
  // shards 1 and 2.
  const std::vector<uint64_t> history = {1, 2, 3, 4, 5, 6, 101, 102, 201};
  ASSERT_TRUE(Event(0, {.kind = Kind::kEmbShardResident, .table_id = 0, .shard = 0}).ok());
  ASSERT_TRUE(Event(1, {.kind = Kind::kEmbShardResident, .table_id = 0, .shard = 1}).ok());
  ASSERT_TRUE(Event(1, {.kind = Kind::kEmbShardResident, .table_id = 0, .shard = 2}).ok());
  // The paper's h_emb: |Prof ∩ EMBM| ÷ |Prof| = 2/3 on node 1, 1/3 on node 0.
  RouteResult r = cluster_->Route(7, history, false);
  EXPECT_EQ(r.node_id, "n1");
  EXPECT_DOUBLE_EQ(r.decision.h_emb, 2.0 / 3);
  cluster_->Completed(r.decision.node);
  // Weighted by the profile's events: 6/9 on node 0, 3/9 on node 1.
  ClusterOptions o;
  o.h_emb_by_events = true;
  Build(o);
  ASSERT_TRUE(Event(0, {.kind = Kind::kEmbShardResident, .table_id = 0, .shard = 0}).ok());
  ASSERT_TRUE(Event(1, {.kind = Kind::kEmbShardResident, .table_id = 0, .shard = 1}).ok());
  ASSERT_TRUE(Event(1, {.kind = Kind::kEmbShardResident, .table_id = 0, .shard = 2}).ok());
  r = cluster_->Route(7, history, false);
  EXPECT_EQ(r.node_id, "n0");
  EXPECT_DOUBLE_EQ(r.decision.h_emb, 6.0 / 9);
  EXPECT_DOUBLE_EQ(r.decision.best_h_emb, 6.0 / 9);
}

TEST_F(ClusterTest, WeightsCanBeReplacedWhenValid) {
  EXPECT_DOUBLE_EQ(cluster_->weights().kv, 0.5);  // C_kv 2 of 4
  EXPECT_FALSE(cluster_->SetWeights({.kv = 0.5, .emb = 0.5, .load = 0.5}).ok());
  EXPECT_FALSE(cluster_->SetWeights({.kv = -0.5, .emb = 1, .load = 0.5}).ok());
  ASSERT_TRUE(cluster_->SetWeights({.kv = 0.1, .emb = 0.8, .load = 0.1}).ok());
  EXPECT_DOUBLE_EQ(cluster_->weights().emb, 0.8);
  // Node 0 holds the user's K/V, node 2 its embeddings: EMB now wins.
  ASSERT_TRUE(Event(2, {.kind = Kind::kEmbShardResident, .table_id = 0, .shard = 0}).ok());
  ASSERT_TRUE(Event(0, {.kind = Kind::kKvStored, .user_id = 7, .tokens = 5}).ok());
  EXPECT_EQ(cluster_->Route(7, History(), false).node_id, "n2");
}

// Once a user's K/V are gone from its last node, nothing is left to hold it there: by default the
// router does not send it back to that node when another is less loaded (an affinity bonus did,
// and queued first visits behind busy nodes: docs/router.md, "Why ε is 0").
TEST_F(ClusterTest, AUserWhoseKvIsGoneGoesToTheLessLoadedNode) {
  const RouteResult first = cluster_->Route(9, {}, false);
  const int last = first.decision.node;
  ASSERT_TRUE(Event(last, {.kind = Kind::kKvStored, .user_id = 9, .tokens = 5}).ok());
  ASSERT_TRUE(Event(last, {.kind = Kind::kKvEvicted, .user_id = 9}).ok());
  // `first` is still in flight there: its node is one request busier than the others.
  const RouteResult again = cluster_->Route(9, {}, false);
  EXPECT_NE(again.decision.node, last);
  EXPECT_EQ(again.decision.h_kv, 0.0);
  EXPECT_NE(again.decision.reason, Reason::kAffinity);
  // With a bonus worth more than one request of load (the paper's ε 0.05), it goes back.
  ClusterOptions sticky;
  sticky.scorer.epsilon = 0.05;
  Build(sticky);
  const int held = cluster_->Route(9, {}, false).decision.node;
  ASSERT_TRUE(Event(held, {.kind = Kind::kKvStored, .user_id = 9, .tokens = 5}).ok());
  ASSERT_TRUE(Event(held, {.kind = Kind::kKvEvicted, .user_id = 9}).ok());
  const RouteResult back = cluster_->Route(9, {}, false);
  EXPECT_EQ(back.decision.node, held);
  EXPECT_EQ(back.decision.reason, Reason::kAffinity);
}

TEST_F(ClusterTest, SpeculativeEntriesExpireUnlessConfirmed) {
  ClusterOptions o;
  o.speculative_ttl = absl::Seconds(2);
  o.policy = PolicyKind::kRoundRobin;  // choose the node regardless of residency
  Build(o);
  const RouteResult r = cluster_->Route(9, History(), false);
  cluster_->Completed(r.decision.node);
  const int n = r.decision.node;
  EXPECT_EQ(cluster_->Nodes()[static_cast<size_t>(n)].speculative_users, 1u);
  clock_.AdvanceBy(absl::Seconds(3));
  EXPECT_EQ(cluster_->Nodes()[static_cast<size_t>(n)].speculative_users, 0u);
  // Confirmed by an event: resident for good.
  const RouteResult r2 = cluster_->Route(10, History(), false);
  ASSERT_TRUE(Event(r2.decision.node, {.kind = Kind::kKvStored, .user_id = 10, .tokens = 3}).ok());
  clock_.AdvanceBy(absl::Seconds(3));
  const NodeStatus s = cluster_->Nodes()[static_cast<size_t>(r2.decision.node)];
  EXPECT_EQ(s.resident_users, 1u);
  EXPECT_EQ(s.speculative_users, 0u);
}

TEST_F(ClusterTest, ProtocolGapsEpochsReplaysAndSnapshots) {
  ASSERT_TRUE(Event(0, {.kind = Kind::kKvStored, .user_id = 1, .tokens = 5}).ok());
  // A replay overlapping what was applied is ignored.
  ResidencyEvent old{.epoch = 100, .seq = 1, .kind = Kind::kKvEvicted, .user_id = 1};
  EXPECT_TRUE(cluster_->Apply(nodes_[0], old).ok());
  EXPECT_EQ(cluster_->Nodes()[0].resident_users, 1u);
  // A gap: degraded, FAILED_PRECONDITION; the view is saturated for routing.
  ResidencyEvent gap{.epoch = 100, .seq = 5, .kind = Kind::kKvStored, .user_id = 2};
  EXPECT_EQ(cluster_->Apply(nodes_[0], gap).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cluster_->Nodes()[0].view, NodeView::kDegraded);
  EXPECT_EQ(cluster_->Nodes()[0].load, 1.0);
  // The missing events replayed: exact again.
  for (uint64_t seq = 2; seq <= 4; ++seq) {
    ASSERT_TRUE(
        cluster_->Apply(nodes_[0], {.epoch = 100, .seq = seq, .kind = Kind::kLoadReport}).ok());
  }
  EXPECT_EQ(cluster_->Nodes()[0].view, NodeView::kExact);
  // A snapshot resets the view to its state.
  cluster_->Reset(nodes_[0], {.epoch = 100, .seq = 5, .users = {{1, 5}, {2, 4}}, .load = {}});
  EXPECT_EQ(cluster_->Nodes()[0].view, NodeView::kExact);
  EXPECT_EQ(cluster_->Nodes()[0].resident_users, 2u);
  ResidencyEvent next{.epoch = 100, .seq = 6, .kind = Kind::kKvEvicted, .user_id = 2};
  EXPECT_TRUE(cluster_->Apply(nodes_[0], next).ok());
  EXPECT_EQ(cluster_->Nodes()[0].resident_users, 1u);
  // A restarted node (new epoch): degraded until its snapshot, which drops the old entries.
  ResidencyEvent restarted{.epoch = 200, .seq = 1, .kind = Kind::kKvStored, .user_id = 3};
  EXPECT_EQ(cluster_->Apply(nodes_[0], restarted).code(), absl::StatusCode::kFailedPrecondition);
  cluster_->Reset(nodes_[0], {.epoch = 200, .seq = 0, .users = {}, .load = {}});
  EXPECT_EQ(cluster_->Nodes()[0].resident_users, 0u);
  EXPECT_TRUE(cluster_->Apply(nodes_[0], restarted).ok());
  const ClusterStats s = cluster_->Stats();
  EXPECT_EQ(s.gaps, 1u);
  EXPECT_EQ(s.epoch_resets, 1u);
  EXPECT_EQ(s.events_ignored, 1u);
}

TEST_F(ClusterTest, LoadCombinesReportsDispatchesAndStaleness) {
  ClusterOptions o;
  o.in_flight_capacity = 4;
  o.max_report_age = absl::Seconds(3);
  Build(o);
  // Four dispatches to a node since its report add 4 / 4 = 1.0 to its load; a burst spreads.
  std::vector<int> counts(3, 0);
  for (uint64_t user = 0; user < 9; ++user)
    ++counts[cluster_->Route(user, {}, false).decision.node];
  EXPECT_EQ(counts, (std::vector<int>{3, 3, 3}));
  // A load report resets the router's own count.
  ASSERT_TRUE(Event(0, {.kind = Kind::kLoadReport, .load = {.load = 0.3}}).ok());
  EXPECT_DOUBLE_EQ(cluster_->Nodes()[0].load, 0.3);
  // A report older than max_report_age: saturated.
  clock_.AdvanceBy(absl::Seconds(4));
  EXPECT_EQ(cluster_->Nodes()[0].load, 1.0);
  ASSERT_TRUE(Event(1, {.kind = Kind::kLoadReport, .load = {.load = 0.2, .draining = true}}).ok());
  EXPECT_EQ(cluster_->Nodes()[1].load, 1.0);  // draining
  // Unreachable nodes receive nothing.
  cluster_->SetUnreachable(nodes_[0]);
  cluster_->SetUnreachable(nodes_[1]);
  for (uint64_t user = 20; user < 25; ++user) {
    EXPECT_EQ(cluster_->Route(user, {}, false).node_id, "n2");
  }
  cluster_->SetUnreachable(nodes_[2]);
  EXPECT_EQ(cluster_->Route(30, {}, false).decision.node, -1);
}

TEST_F(ClusterTest, RetriesExcludeAndRemovedNodesLoseTheirUsers) {
  ASSERT_TRUE(Event(1, {.kind = Kind::kKvStored, .user_id = 7, .tokens = 5}).ok());
  const int excluded[] = {nodes_[1]};
  EXPECT_NE(cluster_->Route(7, History(), false, excluded).node_id, "n1");
  cluster_->RemoveNode(nodes_[1]);
  EXPECT_EQ(cluster_->FindNode("n1"), -1);
  EXPECT_NE(cluster_->Route(7, History(), false).node_id, "n1");
  EXPECT_EQ(cluster_->Nodes().size(), 2u);
}

// An answer from a node that has left (its index since taken by a newcomer) touches nothing of
// the newcomer: Completed and Forget carry the node's generation from the RouteResult.
TEST_F(ClusterTest, AnAnswerFromANodeThatLeftDoesNotTouchItsSuccessor) {
  const int only_n2[] = {nodes_[0], nodes_[1]};
  const RouteResult old = cluster_->Route(7, History(), false, only_n2);
  ASSERT_EQ(old.node_id, "n2");
  cluster_->RemoveNode(nodes_[2]);
  const int index = *cluster_->AddNode("n3", "addr3");
  ASSERT_EQ(index, nodes_[2]);  // the freed slot
  cluster_->Reset(index, {.epoch = 300, .load = {.load = 0.1}});
  const RouteResult fresh = cluster_->Route(8, History(), false, only_n2);
  ASSERT_EQ(fresh.node_id, "n3");
  EXPECT_NE(fresh.node_generation, old.node_generation);
  auto newcomer = [&] {
    for (const NodeStatus& n : cluster_->Nodes()) {
      if (n.id == "n3") return n;
    }
    return NodeStatus{};
  };
  cluster_->Completed(old.decision.node, old.node_generation);  // late: the node it meant left
  cluster_->Forget(old.decision.node, 8, old.node_generation);
  EXPECT_EQ(newcomer().in_flight, 1u);
  EXPECT_EQ(newcomer().speculative_users, 1u);
  cluster_->Completed(fresh.decision.node, fresh.node_generation);
  EXPECT_EQ(newcomer().in_flight, 0u);
}

TEST_F(ClusterTest, IndexMemoryAt32NodesAnd6000UsersEach) {
  ClusterOptions o;
  o.max_nodes = 32;
  o.kv_filter_capacity = 6000;
  o.features = {{.table_id = 0, .residency_shard_rows = 100}};
  SimClock clock;
  auto cluster = *Cluster::Create(o, clock);
  uint64_t user = 0;
  for (int n = 0; n < 32; ++n) {
    const int node = *cluster->AddNode(absl::StrCat("n", n), "");
    serving::ResidencySnapshot s{.epoch = 1, .seq = 0};
    for (int u = 0; u < 6000; ++u) s.users.push_back({user++, 10});
    for (uint64_t shard = 0; shard < 200; ++shard) s.shards.push_back({0, shard * 32 + n});
    cluster->Reset(node, s);
  }
  const ClusterStats st = cluster->Stats();
  // Snapshots size filters for 1.25 × the users: 7 500 → 16 KiB each.
  RecordProperty("index_bytes", std::to_string(st.index_bytes));
  EXPECT_LE(st.index_bytes / 32, 100u << 10);
}

// Which failures get the router's one retry on another node (common/shed.h).
TEST(RetryElsewhereTest, RetriesNodesDownAndAdmissionRefusalsOnly) {
  EXPECT_TRUE(RetryElsewhere(absl::UnavailableError("connection refused")));
  EXPECT_TRUE(RetryElsewhere(absl::ResourceExhaustedError("the node's queue is full")));
  EXPECT_FALSE(RetryElsewhere(ShedLateError("waited 45ms in its queue")));
  EXPECT_FALSE(RetryElsewhere(MarkShedLate(absl::ResourceExhaustedError("read off the wire"))));
  EXPECT_FALSE(RetryElsewhere(absl::InvalidArgumentError("history: too long")));
  EXPECT_FALSE(RetryElsewhere(absl::DeadlineExceededError("deadline passed while queued")));
  EXPECT_FALSE(RetryElsewhere(absl::OkStatus()));
  // The mark means something only on RESOURCE_EXHAUSTED.
  EXPECT_FALSE(IsShedLate(MarkShedLate(absl::UnavailableError("draining"))));
  EXPECT_TRUE(RetryElsewhere(MarkShedLate(absl::UnavailableError("draining"))));
}

}  // namespace
}  // namespace hlem::router
