#include "sim/twin/faults.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/rng.h"

namespace hlem::sim {

namespace {
constexpr absl::string_view kWant =
    "want kill:NODE@TIME, restart:NODE@TIME, kill:allocator@TIME or restart:allocator@TIME";
}  // namespace

absl::StatusOr<std::vector<FaultEvent>> ParseFaultPlan(absl::string_view spec) {
  std::vector<FaultEvent> plan;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    FaultEvent e;
    absl::string_view rest = item;
    const bool kill = absl::ConsumePrefix(&rest, "kill:");
    if (!kill && !absl::ConsumePrefix(&rest, "restart:")) {
      return absl::InvalidArgumentError(absl::StrCat("faults: '", item, "': ", kWant));
    }
    const std::vector<absl::string_view> parts = absl::StrSplit(rest, absl::MaxSplits('@', 1));
    const bool allocator = parts.size() == 2 && parts[0] == "allocator";
    if (parts.size() != 2 || (!allocator && !absl::SimpleAtoi(parts[0], &e.node)) ||
        !absl::ParseDuration(parts[1], &e.at) || e.at < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("faults: '", item, "': ", kWant, " (e.g. kill:1@5s)"));
    }
    using Kind = FaultEvent::Kind;
    e.kind = allocator ? (kill ? Kind::kKillAllocator : Kind::kRestartAllocator)
                       : (kill ? Kind::kKillNode : Kind::kRestartNode);
    plan.push_back(e);
  }
  std::stable_sort(plan.begin(), plan.end(),
                   [](const FaultEvent& a, const FaultEvent& b) { return a.at < b.at; });
  return plan;
}

std::string FormatFaultPlan(const std::vector<FaultEvent>& plan) {
  return absl::StrJoin(plan, ",", [](std::string* out, const FaultEvent& e) {
    const bool kill =
        e.kind == FaultEvent::Kind::kKillNode || e.kind == FaultEvent::Kind::kKillAllocator;
    absl::StrAppend(out, kill ? "kill:" : "restart:");
    if (e.allocator()) {
      absl::StrAppend(out, "allocator");
    } else {
      absl::StrAppend(out, e.node);
    }
    absl::StrAppend(out, "@", absl::FormatDuration(e.at));
  });
}

std::vector<FaultEvent> RandomFaultPlan(uint64_t seed, uint32_t nodes, absl::Duration duration,
                                        uint32_t kills) {
  std::vector<FaultEvent> plan;
  if (nodes < 2 || duration <= absl::ZeroDuration()) return plan;
  SplitMix64 rng(seed ^ 0x6661756c7473ULL);  // "faults"
  auto uniform = [&rng](double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(rng() >> 11) * 0x1.0p-53;
  };
  // Draw kill times, then walk them in order keeping each node's state.
  std::vector<absl::Duration> times;
  for (uint32_t k = 0; k < kills; ++k) {
    // Whole milliseconds: the printed plan reads well and parses back to the same times.
    times.push_back(absl::Trunc(absl::Seconds(uniform(0, absl::ToDoubleSeconds(duration))),
                                absl::Milliseconds(1)));
  }
  std::sort(times.begin(), times.end());
  std::vector<absl::Duration> up_at(nodes, absl::ZeroDuration());  // dead until then
  for (absl::Duration t : times) {
    std::vector<uint32_t> live;
    for (uint32_t n = 0; n < nodes; ++n) {
      if (up_at[n] <= t) live.push_back(n);
    }
    if (live.size() < 2) continue;  // keep one node up
    const uint32_t victim = live[rng() % live.size()];
    plan.push_back({.at = t, .kind = FaultEvent::Kind::kKillNode, .node = victim});
    const absl::Duration restart =
        t + absl::Trunc(absl::Seconds(uniform(0.2, 10)), absl::Milliseconds(1));
    if (restart < duration) {
      plan.push_back({.at = restart, .kind = FaultEvent::Kind::kRestartNode, .node = victim});
      up_at[victim] = restart;
    } else {
      up_at[victim] = absl::InfiniteDuration();
    }
  }
  std::stable_sort(plan.begin(), plan.end(),
                   [](const FaultEvent& a, const FaultEvent& b) { return a.at < b.at; });
  return plan;
}

absl::Status ValidateFaultPlan(const std::vector<FaultEvent>& plan, uint32_t nodes) {
  std::vector<bool> dead(nodes, false);
  bool allocator_dead = false;
  for (const FaultEvent& e : plan) {
    const std::string what = FormatFaultPlan({e});
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
