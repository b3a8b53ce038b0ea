#include "sim/twin/faults.h"

#include <algorithm>
#include <functional>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/rng.h"

namespace hlem::sim {

namespace {
constexpr absl::string_view kWant =
    "want kill:NODE@TIME, restart:NODE@TIME, kill:allocator@TIME, restart:allocator@TIME, "
    "kill:shardS@TIME, restart:shardS@TIME, stop:shardS@TIME or cont:shardS@TIME";

using Kind = FaultEvent::Kind;

absl::string_view Verb(Kind k) {
  switch (k) {
    case Kind::kKillNode:
    case Kind::kKillAllocator:
    case Kind::kKillShard:
      return "kill";
    case Kind::kRestartNode:
    case Kind::kRestartAllocator:
    case Kind::kRestartShard:
      return "restart";
    case Kind::kStopShard:
      return "stop";
    case Kind::kContinueShard:
      return "cont";
  }
  return "?";
}

void SortByTime(std::vector<FaultEvent>* plan) {
  std::stable_sort(plan->begin(), plan->end(),
                   [](const FaultEvent& a, const FaultEvent& b) { return a.at < b.at; });
}

// Whole milliseconds: a drawn plan prints well and parses back to the same times.
absl::Duration Millis(double seconds) {
  return absl::Trunc(absl::Seconds(seconds), absl::Milliseconds(1));
}

// The outages of a random plan: `count` start times uniform over [0, duration), walked in order,
// each taking a random one of `targets` that is up then (skipped while no more than `keep_up`
// are), back after a uniform 0.2–10 s when that is before `duration` (else nullopt).
void DrawOutages(
    SplitMix64& rng, uint32_t targets, uint32_t count, uint32_t keep_up, absl::Duration duration,
    const std::function<void(absl::Duration, uint32_t, std::optional<absl::Duration>)>& emit) {
  if (targets == 0 || duration <= absl::ZeroDuration()) return;
  auto uniform = [&rng](double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(rng() >> 11) * 0x1.0p-53;
  };
  std::vector<absl::Duration> times;
  for (uint32_t k = 0; k < count; ++k) {
    times.push_back(Millis(uniform(0, absl::ToDoubleSeconds(duration))));
  }
  std::sort(times.begin(), times.end());
  std::vector<absl::Duration> up_at(targets, absl::ZeroDuration());  // down until then
  for (absl::Duration t : times) {
    std::vector<uint32_t> up;
    for (uint32_t n = 0; n < targets; ++n) {
      if (up_at[n] <= t) up.push_back(n);
    }
    if (up.size() <= keep_up) continue;
    const uint32_t victim = up[rng() % up.size()];
    const absl::Duration back = t + Millis(uniform(0.2, 10));
    up_at[victim] = back < duration ? back : absl::InfiniteDuration();
    emit(t, victim, back < duration ? std::optional<absl::Duration>(back) : std::nullopt);
  }
}
}  // namespace

absl::StatusOr<std::vector<FaultEvent>> ParseFaultPlan(absl::string_view spec) {
  std::vector<FaultEvent> plan;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    FaultEvent e;
    const std::vector<absl::string_view> verb = absl::StrSplit(item, absl::MaxSplits(':', 1));
    const std::vector<absl::string_view> parts =
        absl::StrSplit(verb.size() == 2 ? verb[1] : "", absl::MaxSplits('@', 1));
    auto bad = [&] {
      return absl::InvalidArgumentError(
          absl::StrCat("faults: '", item, "': ", kWant, " (e.g. kill:1@5s)"));
    };
    if (verb.size() != 2 || parts.size() != 2 || !absl::ParseDuration(parts[1], &e.at) ||
        e.at < absl::ZeroDuration()) {
      return bad();
    }
    absl::string_view target = parts[0];
    const bool shard = absl::ConsumePrefix(&target, "shard");
    const bool allocator = !shard && target == "allocator";
    if (!allocator && !absl::SimpleAtoi(target, shard ? &e.shard : &e.node)) return bad();
    if (verb[0] == "kill") {
      e.kind = shard ? Kind::kKillShard : allocator ? Kind::kKillAllocator : Kind::kKillNode;
    } else if (verb[0] == "restart") {
      e.kind = shard       ? Kind::kRestartShard
               : allocator ? Kind::kRestartAllocator
                           : Kind::kRestartNode;
    } else if (shard && verb[0] == "stop") {
      e.kind = Kind::kStopShard;
    } else if (shard && verb[0] == "cont") {
      e.kind = Kind::kContinueShard;
    } else {
      return bad();
    }
    plan.push_back(e);
  }
  SortByTime(&plan);
  return plan;
}

std::string FormatFaultPlan(const std::vector<FaultEvent>& plan) {
  return absl::StrJoin(plan, ",", [](std::string* out, const FaultEvent& e) {
    absl::StrAppend(out, Verb(e.kind), ":");
    if (e.allocator()) {
      absl::StrAppend(out, "allocator");
    } else if (e.shard_event()) {
      absl::StrAppend(out, "shard", e.shard);
    } else {
      absl::StrAppend(out, e.node);
    }
    absl::StrAppend(out, "@", absl::FormatDuration(e.at));
  });
}

std::vector<FaultEvent> RandomFaultPlan(uint64_t seed, uint32_t nodes, absl::Duration duration,
                                        uint32_t kills) {
  std::vector<FaultEvent> plan;
  if (nodes < 2) return plan;
  SplitMix64 rng(seed ^ 0x6661756c7473ULL);  // "faults"
  DrawOutages(rng, nodes, kills, /*keep_up=*/1, duration,
              [&](absl::Duration at, uint32_t node, std::optional<absl::Duration> back) {
                plan.push_back({.at = at, .kind = Kind::kKillNode, .node = node});
                if (back) plan.push_back({.at = *back, .kind = Kind::kRestartNode, .node = node});
              });
  SortByTime(&plan);
  return plan;
}

std::vector<FaultEvent> RandomShardFaultPlan(uint64_t seed, uint32_t shards,
                                             absl::Duration duration, uint32_t faults) {
  std::vector<FaultEvent> plan;
  SplitMix64 rng(seed ^ 0x7368617264667473ULL);  // "shardfts"
  DrawOutages(rng, shards, faults, /*keep_up=*/0, duration,
              [&](absl::Duration at, uint32_t shard, std::optional<absl::Duration> back) {
                const bool kill = (rng() & 1) == 0;
                plan.push_back(
                    {.at = at, .kind = kill ? Kind::kKillShard : Kind::kStopShard, .shard = shard});
                if (back) {
                  plan.push_back({.at = *back,
                                  .kind = kill ? Kind::kRestartShard : Kind::kContinueShard,
                                  .shard = shard});
                }
              });
  SortByTime(&plan);
  return plan;
}

absl::StatusOr<std::vector<FaultEvent>> FaultPlanFromSpec(absl::string_view spec, uint32_t nodes,
                                                          uint32_t shards,
                                                          absl::Duration duration) {
  if (!absl::ConsumePrefix(&spec, "random:")) return ParseFaultPlan(spec);
  uint64_t seed = 0;
  uint32_t kills = 0, shard_faults = 0;
  const std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  if ((parts.size() != 2 && parts.size() != 3) || !absl::SimpleAtoi(parts[0], &seed) ||
      !absl::SimpleAtoi(parts[1], &kills) ||
      (parts.size() == 3 && !absl::SimpleAtoi(parts[2], &shard_faults))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "faults: 'random:", spec, "': want random:SEED:KILLS[:SHARD_FAULTS] or a plan"));
  }
  std::vector<FaultEvent> plan = RandomFaultPlan(seed, nodes, duration, kills);
  for (const FaultEvent& e : RandomShardFaultPlan(seed, shards, duration, shard_faults)) {
    plan.push_back(e);
  }
  SortByTime(&plan);
  return plan;
}

absl::Status ValidateFaultPlan(const std::vector<FaultEvent>& plan, uint32_t nodes,
                               uint32_t shards) {
  std::vector<bool> dead(nodes, false);
  enum class Shard { kServing, kKilled, kStopped };
  std::vector<Shard> shard(shards, Shard::kServing);
  bool allocator_dead = false;
  for (const FaultEvent& e : plan) {
    const std::string what = FormatFaultPlan({e});
    if (e.shard_event()) {
      if (shards == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "faults: ", what, ": the twin has no shard map (a node config names the shards)"));
      }
      if (e.shard >= shards) {
        return absl::InvalidArgumentError(
            absl::StrCat("faults: ", what, ": shard ", e.shard, " of ", shards));
      }
      Shard& s = shard[e.shard];
      const Shard want = e.kind == Kind::kRestartShard    ? Shard::kKilled
                         : e.kind == Kind::kContinueShard ? Shard::kStopped
                                                          : Shard::kServing;
      if (s != want) {
        return absl::InvalidArgumentError(absl::StrCat("faults: ", what, ": the shard is ",
                                                       s == Shard::kServing  ? "serving"
                                                       : s == Shard::kKilled ? "dead"
                                                                             : "stopped"));
      }
      s = e.kind == Kind::kKillShard   ? Shard::kKilled
          : e.kind == Kind::kStopShard ? Shard::kStopped
                                       : Shard::kServing;
      continue;
    }
    if (e.allocator()) {
      const bool kill = e.kind == FaultEvent::Kind::kKillAllocator;
      if (kill == allocator_dead) {
        return absl::InvalidArgumentError(
            absl::StrCat("faults: ", what,
                         kill ? ": the allocator is already dead" : ": the allocator is not dead"));
      }
      allocator_dead = kill;
      continue;
    }
    if (e.node >= nodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("faults: ", what, ": node ", e.node, " of ", nodes));
    }
    const bool kill = e.kind == FaultEvent::Kind::kKillNode;
    if (kill == dead[e.node]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "faults: ", what, kill ? ": the node is already dead" : ": the node is not dead"));
    }
    dead[e.node] = kill;
  }
  return absl::OkStatus();
}

bool AllocatorDownAt(const std::vector<FaultEvent>& plan, absl::Duration t) {
  bool down = false;
  absl::Duration last = -absl::InfiniteDuration();
  for (const FaultEvent& e : plan) {  // the latest allocator event at or before t (in any order)
    if (e.allocator() && e.at <= t && e.at >= last) {
      last = e.at;
      down = e.kind == FaultEvent::Kind::kKillAllocator;
    }
  }
  return down;
}

}  // namespace hlem::sim
