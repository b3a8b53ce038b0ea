#include "router/core/policy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hlem::router {
namespace {

// Scores within this of the maximum are ties.
constexpr double kTie = 1e-12;

// The index (into nodes) of the maximum of value(i); ties broken uniformly by rng.
template <typename F>
int ArgMax(std::span<const NodeSignal> nodes, F value, SplitMix64& rng) {
  int best = -1;
  double best_value = 0;
  int ties = 0;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const double v = value(i);
    if (best < 0 || v > best_value + kTie) {
      best = i;
      best_value = v;
      ties = 1;
    } else if (std::abs(v - best_value) <= kTie) {
      // Reservoir choice among the ties: each tied node is kept with probability 1/ties.
      if (rng() % static_cast<uint64_t>(++ties) == 0) best = i;
    }
  }
  return best;
}

int LeastLoaded(std::span<const NodeSignal> nodes, SplitMix64& rng) {
  return ArgMax(
      nodes, [&](int i) { return -nodes[i].load; }, rng);
}

// The least-loaded among the nodes with the highest value(i).
template <typename F>
int BestThenLeastLoaded(std::span<const NodeSignal> nodes, F value, SplitMix64& rng) {
  double top = value(0);
  for (int i = 1; i < static_cast<int>(nodes.size()); ++i) top = std::max(top, value(i));
  return ArgMax(
      nodes, [&](int i) { return value(i) >= top - kTie ? 2 - nodes[i].load : -1.0; }, rng);
}

Decision Fill(std::span<const NodeSignal> nodes, int i, Reason reason, double score) {
  Decision d;
  d.reason = reason;
  for (const NodeSignal& n : nodes) {
    d.best_h_kv = std::max(d.best_h_kv, n.h_kv);
    d.best_h_emb = std::max(d.best_h_emb, n.h_emb);
  }
  if (i < 0) return d;
  d.node = nodes[i].node;
  d.score = score;
  d.h_kv = nodes[i].h_kv;
  d.h_emb = nodes[i].h_emb;
  d.load = nodes[i].load;
  return d;
}

}  // namespace

const char* ReasonName(Reason reason) {
  switch (reason) {
    case Reason::kScore:
      return "score";
    case Reason::kAffinity:
      return "affinity";
    case Reason::kOverloadFallback:
      return "overload_fallback";
    case Reason::kAllOverloaded:
      return "all_overloaded";
    case Reason::kOnlyNode:
      return "only_node";
    case Reason::kPolicy:
      return "policy";
    case Reason::kShed:
      return "shed";
  }
  return "unknown";
}

const char* PolicyName(PolicyKind policy) {
  switch (policy) {
    case PolicyKind::kHlem:
      return "hlem";
    case PolicyKind::kRoundRobin:
      return "round_robin";
    case PolicyKind::kLeastLoaded:
      return "least_loaded";
    case PolicyKind::kUserHash:
      return "user_hash";
    case PolicyKind::kKvOnly:
      return "kv_only";
    case PolicyKind::kEmbOnly:
      return "emb_only";
  }
  return "unknown";
}

absl::StatusOr<PolicyKind> ParsePolicy(const std::string& name) {
  for (PolicyKind p : {PolicyKind::kHlem, PolicyKind::kRoundRobin, PolicyKind::kLeastLoaded,
                       PolicyKind::kUserHash, PolicyKind::kKvOnly, PolicyKind::kEmbOnly}) {
    if (name == PolicyName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("policy: '", name,
                   "' is not one of hlem, round_robin, least_loaded, user_hash, kv_only, "
                   "emb_only"));
}

absl::StatusOr<Weights> NormalisedWeights(const ScorerOptions& o) {
  for (double c : {o.c_kv, o.c_emb, o.c_load}) {
    if (!std::isfinite(c) || c < 0) {
      return absl::InvalidArgumentError("scorer: miss costs must be finite and >= 0");
    }
  }
  const double sum = o.c_kv + o.c_emb + o.c_load;
  if (sum <= 0) return absl::InvalidArgumentError("scorer: miss costs sum to 0");
  return Weights{o.c_kv / sum, o.c_emb / sum, o.c_load / sum};
}

Decision ScoreRoute(std::span<const NodeSignal> nodes, int affinity, const Weights& w,
                    const ScorerOptions& options, SplitMix64& rng) {
  if (nodes.empty()) return Fill(nodes, -1, Reason::kScore, 0);
  auto base = [&](int i) {
    return w.kv * nodes[i].h_kv + w.emb * nodes[i].h_emb + w.load * (1 - nodes[i].load);
  };
  auto score = [&](int i) { return base(i) + (nodes[i].node == affinity ? options.epsilon : 0.0); };
  int best = ArgMax(nodes, score, rng);
  // A tie goes to the user's last node rather than to chance, also with ε 0: what the signals do
  // not show yet (rows in flight, K/V a report has not confirmed) is likelier there.
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    if (nodes[i].node == affinity && i != best && score(i) >= score(best) - kTie) best = i;
  }
  const bool all_over = std::all_of(nodes.begin(), nodes.end(),
                                    [&](const NodeSignal& n) { return n.load > options.tau; });
  if (all_over) {
    if (options.all_overloaded == AllOverloaded::kShed) return Fill(nodes, -1, Reason::kShed, 0);
    if (nodes.size() == 1) return Fill(nodes, 0, Reason::kOnlyNode, score(0));
    const int i = LeastLoaded(nodes, rng);
    return Fill(nodes, i, Reason::kAllOverloaded, score(i));
  }
  if (nodes.size() == 1) return Fill(nodes, 0, Reason::kOnlyNode, score(0));
  if (nodes[best].load > options.tau) {
    const int i = LeastLoaded(nodes, rng);
    return Fill(nodes, i, Reason::kOverloadFallback, score(i));
  }
  // Did the bonus decide? The winner without it scores strictly less than another node.
  bool affinity_decided = false;
  if (nodes[best].node == affinity) {
    for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
      if (i != best && base(i) > base(best) - kTie) affinity_decided = true;
    }
  }
  return Fill(nodes, best, affinity_decided ? Reason::kAffinity : Reason::kScore, score(best));
}

Decision PolicyRoute(PolicyKind policy, std::span<const NodeSignal> nodes, uint64_t user,
                     uint64_t* round_robin, SplitMix64& rng) {
  if (nodes.empty()) return Fill(nodes, -1, Reason::kPolicy, 0);
  int i = 0;
  switch (policy) {
    case PolicyKind::kHlem:  // not a comparison policy; treated as least-loaded
    case PolicyKind::kLeastLoaded:
      i = LeastLoaded(nodes, rng);
      break;
    case PolicyKind::kRoundRobin:
      i = static_cast<int>((*round_robin)++ % nodes.size());
      break;
    case PolicyKind::kUserHash: {
      // Rendezvous hashing: a user stays on its node while that node is present.
      i = ArgMax(
          nodes, [&](int k) { return static_cast<double>(Mix64(user ^ nodes[k].key) >> 11); }, rng);
      break;
    }
    case PolicyKind::kKvOnly:
      i = BestThenLeastLoaded(
          nodes, [&](int k) { return nodes[k].h_kv; }, rng);
      break;
    case PolicyKind::kEmbOnly:
      i = BestThenLeastLoaded(
          nodes, [&](int k) { return nodes[k].h_emb; }, rng);
      break;
  }
  return Fill(nodes, i, Reason::kPolicy, 0);
}

}  // namespace hlem::router
