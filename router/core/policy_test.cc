#include "router/core/policy.h"

#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace hlem::router {
namespace {

// C_kv = 2, C_emb = 1, C_ld = 1: w = (0.5, 0.25, 0.25).
ScorerOptions Options() {
  return {.c_kv = 2, .c_emb = 1, .c_load = 1, .tau = 0.85, .epsilon = 0.05};
}

TEST(PolicyTest, WeightsAreCostShares) {
  const Weights w = *NormalisedWeights(Options());
  EXPECT_DOUBLE_EQ(w.kv, 0.5);
  EXPECT_DOUBLE_EQ(w.emb, 0.25);
  EXPECT_DOUBLE_EQ(w.load, 0.25);
  EXPECT_FALSE(NormalisedWeights({.c_kv = -1}).ok());
  EXPECT_FALSE(NormalisedWeights({.c_kv = 0, .c_emb = 0, .c_load = 0}).ok());
}

TEST(PolicyTest, AlgorithmOneByHand) {
  const Weights w = *NormalisedWeights(Options());
  SplitMix64 rng(1);
  // score(0) = 0.5·0 + 0.25·0.8 + 0.25·(1 − 0.2) = 0.4
  // score(1) = 0.5·1 + 0.25·0.1 + 0.25·(1 − 0.5) = 0.65
  // score(2) = 0.5·0 + 0.25·1.0 + 0.25·(1 − 0.0) = 0.5
  std::vector<NodeSignal> nodes = {{.node = 10, .h_kv = 0, .h_emb = 0.8, .load = 0.2},
                                   {.node = 11, .h_kv = 1, .h_emb = 0.1, .load = 0.5},
                                   {.node = 12, .h_kv = 0, .h_emb = 1.0, .load = 0.0}};
  Decision d = ScoreRoute(nodes, -1, w, Options(), rng);
  EXPECT_EQ(d.node, 11);
  EXPECT_EQ(d.reason, Reason::kScore);
  EXPECT_DOUBLE_EQ(d.score, 0.65);
  EXPECT_EQ(d.h_kv, 1.0);
  EXPECT_DOUBLE_EQ(d.best_h_emb, 1.0);
  // Affinity to node 12: 0.55 < 0.65, still node 11.
  EXPECT_EQ(ScoreRoute(nodes, 12, w, Options(), rng).node, 11);
  // Node 11 over τ: the least-loaded node (12) instead.
  nodes[1].load = 0.9;
  d = ScoreRoute(nodes, -1, w, Options(), rng);
  EXPECT_EQ(d.node, 12);
  EXPECT_EQ(d.reason, Reason::kOverloadFallback);
  EXPECT_EQ(d.best_h_kv, 1.0);  // the locality given up for load is visible
  // Every node over τ: least-loaded, or shed.
  for (NodeSignal& n : nodes) n.load += 0.9;
  d = ScoreRoute(nodes, -1, w, Options(), rng);
  EXPECT_EQ(d.node, 12);
  EXPECT_EQ(d.reason, Reason::kAllOverloaded);
  ScorerOptions shed = Options();
  shed.all_overloaded = AllOverloaded::kShed;
  d = ScoreRoute(nodes, -1, w, shed, rng);
  EXPECT_EQ(d.node, -1);
  EXPECT_EQ(d.reason, Reason::kShed);
  // One node.
  d = ScoreRoute(std::span<const NodeSignal>(nodes).first(1), -1, w, Options(), rng);
  EXPECT_EQ(d.node, 10);
  EXPECT_EQ(d.reason, Reason::kOnlyNode);
  EXPECT_EQ(ScoreRoute({}, -1, w, Options(), rng).node, -1);
}

TEST(PolicyTest, AffinityBreaksTiesAndTiesAreSeeded) {
  const Weights w = *NormalisedWeights(Options());
  const std::vector<NodeSignal> tied = {{.node = 0, .h_emb = 0.5, .load = 0.1},
                                        {.node = 1, .h_emb = 0.5, .load = 0.1},
                                        {.node = 2, .h_emb = 0.5, .load = 0.1}};
  SplitMix64 rng(7);
  Decision d = ScoreRoute(tied, 2, w, Options(), rng);
  EXPECT_EQ(d.node, 2);
  EXPECT_EQ(d.reason, Reason::kAffinity);
  // With no bonus (ε 0, the default), a tie still goes to the user's last node, every time.
  ScorerOptions no_bonus = Options();
  no_bonus.epsilon = 0;
  for (int i = 0; i < 50; ++i) {
    d = ScoreRoute(tied, 1, w, no_bonus, rng);
    EXPECT_EQ(d.node, 1);
    EXPECT_EQ(d.reason, Reason::kAffinity);
  }
  // ... and a node better by anything at all wins over it.
  std::vector<NodeSignal> better = tied;
  better[0].load = 0.09;
  EXPECT_EQ(ScoreRoute(better, 1, w, no_bonus, rng).node, 0);
  // Without affinity every tied node is chosen sometimes, and a seed repeats its choices.
  std::set<int> chosen;
  std::vector<int> first, second;
  SplitMix64 a(3), b(3);
  for (int i = 0; i < 200; ++i) {
    first.push_back(ScoreRoute(tied, -1, w, Options(), a).node);
    second.push_back(ScoreRoute(tied, -1, w, Options(), b).node);
    chosen.insert(first.back());
  }
  EXPECT_EQ(chosen.size(), 3u);
  EXPECT_EQ(first, second);
  // Ties are Reason::kScore, not affinity.
  EXPECT_EQ(ScoreRoute(tied, -1, w, Options(), rng).reason, Reason::kScore);
}

TEST(PolicyTest, ComparisonPolicies) {
  const std::vector<NodeSignal> nodes = {
      {.node = 0, .h_kv = 0, .h_emb = 0.9, .load = 0.5, .key = 11},
      {.node = 1, .h_kv = 1, .h_emb = 0.2, .load = 0.7, .key = 22},
      {.node = 2, .h_kv = 0, .h_emb = 0.9, .load = 0.1, .key = 33}};
  SplitMix64 rng(1);
  uint64_t rr = 0;
  std::vector<int> order;
  for (int i = 0; i < 4; ++i) {
    order.push_back(PolicyRoute(PolicyKind::kRoundRobin, nodes, 1, &rr, rng).node);
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 0}));
  EXPECT_EQ(PolicyRoute(PolicyKind::kLeastLoaded, nodes, 1, &rr, rng).node, 2);
  EXPECT_EQ(PolicyRoute(PolicyKind::kKvOnly, nodes, 1, &rr, rng).node, 1);
  EXPECT_EQ(PolicyRoute(PolicyKind::kEmbOnly, nodes, 1, &rr, rng).node, 2);  // tie on h_emb
  EXPECT_EQ(PolicyRoute(PolicyKind::kEmbOnly, nodes, 1, &rr, rng).reason, Reason::kPolicy);
  // User hash: stable per user, and spread over the nodes.
  std::set<int> spread;
  for (uint64_t user = 0; user < 64; ++user) {
    const int n = PolicyRoute(PolicyKind::kUserHash, nodes, user, &rr, rng).node;
    EXPECT_EQ(PolicyRoute(PolicyKind::kUserHash, nodes, user, &rr, rng).node, n);
    spread.insert(n);
  }
  EXPECT_EQ(spread.size(), 3u);
  EXPECT_EQ(*ParsePolicy("kv_only"), PolicyKind::kKvOnly);
  EXPECT_FALSE(ParsePolicy("best").ok());
}

}  // namespace
}  // namespace hlem::router
