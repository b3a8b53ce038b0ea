#pragma once
// Faults injected into the digital twin (issue 11): serving nodes killed and restarted on a
// schedule, as tests/e2e/faults_test.sh does to the real cluster. A schedule is either written
// out ("kill:1@5s,restart:1@7.5s") or drawn from a seed (RandomFaultPlan), and printed back in the
// written form, so a failing seed replays exactly: the twin is deterministic.
//
// What a kill does in the twin (Twin::KillNode): the node stops at once; the requests in flight
// there fail UNAVAILABLE (the router retries each once elsewhere, as `router --retry` does);
// requests routed to it before the router notices fail at once the same way (a refused
// connection); `TwinOptions::fault_detection` later the router removes it. A restart brings up a
// fresh node (new incarnation epoch, empty caches) that joins the router, which drops the old
// incarnation's residency.
//
// The allocator ("kill:allocator@T", "restart:allocator@T") is the twin's control loop
// (sim/twin/control.h): while it is dead no node's α changes and the windows that close go
// undecided; a restarted allocator starts over as the real one does (allocator_service/core): a
// fresh controller per node, the windows the node already closed as its history, and a decision
// on the newest window first.
//
// Embedding shards ("kill:shard0@T", "restart:shard0@T", "stop:shard1@T", "cont:shard1@T", as
// `kill -9` and SIGSTOP/SIGCONT do to the real ones) need the twin to know the shard map
// (TwinOptions::shards): the nodes' shard clients fail over to replicas, mark servers down and
// probe them back as the real client does (sim/twin/sim_shards.h); a partition with no live
// replica fails the fetch UNAVAILABLE, a server that stops answering costs the attempt timeout
// (or the request's deadline, at the last replica).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace hlem::sim {

struct FaultEvent {
  enum class Kind {
    kKillNode,
    kRestartNode,
    kKillAllocator,
    kRestartAllocator,
    kKillShard,
    kRestartShard,
    kStopShard,
    kContinueShard
  };
  absl::Duration at;  // after the start of the replay
  Kind kind = Kind::kKillNode;
  uint32_t node = 0;   // node events only
  uint32_t shard = 0;  // shard events only
  bool allocator() const { return kind == Kind::kKillAllocator || kind == Kind::kRestartAllocator; }
  bool shard_event() const {
    return kind == Kind::kKillShard || kind == Kind::kRestartShard || kind == Kind::kStopShard ||
           kind == Kind::kContinueShard;
  }
  bool operator==(const FaultEvent&) const = default;
};

// "kill:N@T,restart:N@T,kill:allocator@T,kill:shardS@T,stop:shardS@T,cont:shardS@T,..." with T an
// absl duration ("5s", "1.5s", "250ms"); events in any order (sorted by time, stable). "" = no
// faults. Errors name the bad item.
absl::StatusOr<std::vector<FaultEvent>> ParseFaultPlan(absl::string_view spec);
std::string FormatFaultPlan(const std::vector<FaultEvent>& plan);

// `kills` node kills at uniform times in [0, duration), each node at most once dead at a time,
// each restarted after a uniform 0.2–10 s (when that is before `duration`), at most nodes - 1
// nodes dead at once. The same arguments give the same plan.
std::vector<FaultEvent> RandomFaultPlan(uint64_t seed, uint32_t nodes, absl::Duration duration,
                                        uint32_t kills);

// `faults` shard faults at uniform times in [0, duration): each a kill (then a restart) or a stop
// (then a cont), by a fair coin, of a shard that is serving then, ended after a uniform 0.2–10 s
// (when that is before `duration`). Any number of shards may be down at once: a partition with no
// live replica is part of what this tests. The same arguments give the same plan.
std::vector<FaultEvent> RandomShardFaultPlan(uint64_t seed, uint32_t shards,
                                             absl::Duration duration, uint32_t faults);

// "random:SEED:KILLS" (node kills) or "random:SEED:KILLS:SHARD_FAULTS", drawn over `duration`;
// anything else is parsed as a written plan (ParseFaultPlan). Errors name the spec.
absl::StatusOr<std::vector<FaultEvent>> FaultPlanFromSpec(absl::string_view spec, uint32_t nodes,
                                                          uint32_t shards, absl::Duration duration);

// Checks a plan against a cluster of `nodes` and `shards` (0: the twin has no shard map, so no
// shard event is allowed): ids in range, a restart only of a dead node, allocator or shard, a cont
// only of a stopped shard, no kill of a dead one, no stop of a shard that is not serving. Errors
// name the event.
absl::Status ValidateFaultPlan(const std::vector<FaultEvent>& plan, uint32_t nodes,
                               uint32_t shards = 0);

// Whether the plan has the allocator dead at `t` (its last allocator event at or before t is a
// kill).
bool AllocatorDownAt(const std::vector<FaultEvent>& plan, absl::Duration t);

}  // namespace hlem::sim
