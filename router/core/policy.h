#pragma once
// Routing decisions over per-node signals (ARCHITECTURE §6; the reference paper's Algorithm 1) and
// the comparison policies. Pure functions: the cluster state (cluster.h) computes the signals of
// every routable node and calls one of these; tests call them with hand-made signals.
//
// Algorithm 1: score(n) = w_kv·h_kv + w_emb·h_emb + w_ld·(1 − l(n)) + ε·[n = Aff[u]], with
// w_i = C_i ÷ (C_kv + C_emb + C_ld). n* = argmax score (ties: seeded RNG). If l(n*) > τ the
// least-loaded node is taken instead (OVERLOAD_FALLBACK); if every node is above τ the configured
// rule decides: least-loaded (ALL_OVERLOADED) or shed (no node). With one node: ONLY_NODE.
// AFFINITY when the ε bonus changed the winner.

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/rng.h"

namespace hlem::router {

enum class Reason : uint8_t {
  kScore,
  kAffinity,
  kOverloadFallback,
  kAllOverloaded,
  kOnlyNode,
  kPolicy,
  kShed,  // every node above τ and the rule is to shed: no node chosen
};
const char* ReasonName(Reason reason);

enum class PolicyKind : uint8_t { kHlem, kRoundRobin, kLeastLoaded, kUserHash, kKvOnly, kEmbOnly };
const char* PolicyName(PolicyKind policy);
// "hlem", "round_robin", "least_loaded", "user_hash", "kv_only", "emb_only"; INVALID_ARGUMENT else.
absl::StatusOr<PolicyKind> ParsePolicy(const std::string& name);

enum class AllOverloaded : uint8_t { kLeastLoaded, kShed };

struct ScorerOptions {
  // Miss costs (any unit, e.g. seconds per miss); the weights are their shares.
  double c_kv = 1, c_emb = 1, c_load = 1;
  double tau = 0.85;  // load threshold
  // Affinity bonus for the user's last node. 0 by default: the speculative K/V entry already
  // holds a user to its node while its K/V may be there, and a bonus beyond that sent users whose
  // K/V were gone back to busy nodes (P99 +3 to +18 % in the twin; docs/router.md, "Why ε is 0").
  // Exact ties go to the last node whatever ε is.
  double epsilon = 0;
  AllOverloaded all_overloaded = AllOverloaded::kLeastLoaded;
};

struct Weights {
  double kv = 0, emb = 0, load = 0;
};
// C_i ÷ ΣC; INVALID_ARGUMENT for a negative or non-finite cost or a zero sum.
absl::StatusOr<Weights> NormalisedWeights(const ScorerOptions& options);

// One routable node's signals for one request.
struct NodeSignal {
  int node = 0;      // the caller's node index
  double h_kv = 0;   // 1 when the user's K/V are believed resident
  double h_emb = 0;  // |Prof ∩ EMBM| ÷ |Prof|
  double load = 0;   // l(n) in [0, 1]
  uint64_t key = 0;  // stable identity for user-hash routing (e.g. a hash of the node id)
};

struct Decision {
  int node = -1;  // -1: none (no routable node, or shed)
  Reason reason = Reason::kScore;
  double score = 0;  // of the chosen node (0 for non-score policies)
  double h_kv = 0, h_emb = 0, load = 0;
  double best_h_kv = 0, best_h_emb = 0;  // best over routable nodes (locality given up for load)
};

// Algorithm 1. `affinity` is the node index of Aff[u] or -1.
Decision ScoreRoute(std::span<const NodeSignal> nodes, int affinity, const Weights& w,
                    const ScorerOptions& options, SplitMix64& rng);
// A comparison policy (not kHlem). `round_robin` is the policy's counter.
Decision PolicyRoute(PolicyKind policy, std::span<const NodeSignal> nodes, uint64_t user,
                     uint64_t* round_robin, SplitMix64& rng);

}  // namespace hlem::router
