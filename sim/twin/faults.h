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

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace hlem::sim {

struct FaultEvent {
  enum class Kind { kKillNode, kRestartNode, kKillAllocator, kRestartAllocator };
  absl::Duration at;  // after the start of the replay
  Kind kind = Kind::kKillNode;
  uint32_t node = 0;  // node events only
  bool allocator() const { return kind == Kind::kKillAllocator || kind == Kind::kRestartAllocator; }
  bool operator==(const FaultEvent&) const = default;
};

// "kill:N@T,restart:N@T,kill:allocator@T,..." with T an absl duration ("5s", "1.5s", "250ms");
// events in any order (sorted by time, stable). "" = no faults. Errors name the bad item.
absl::StatusOr<std::vector<FaultEvent>> ParseFaultPlan(absl::string_view spec);
std::string FormatFaultPlan(const std::vector<FaultEvent>& plan);

// `kills` node kills at uniform times in [0, duration), each node at most once dead at a time,
// each restarted after a uniform 0.2–10 s (when that is before `duration`), at most nodes - 1
// nodes dead at once. The same arguments give the same plan.
std::vector<FaultEvent> RandomFaultPlan(uint64_t seed, uint32_t nodes, absl::Duration duration,
                                        uint32_t kills);

// Checks a plan against a cluster of `nodes`: node ids in range, a restart only of a dead node
// (or allocator), no kill of a dead one. Errors name the event.
absl::Status ValidateFaultPlan(const std::vector<FaultEvent>& plan, uint32_t nodes);

// Whether the plan has the allocator dead at `t` (its last allocator event at or before t is a
// kill).
bool AllocatorDownAt(const std::vector<FaultEvent>& plan, absl::Duration t);

}  // namespace hlem::sim
