#pragma once
// Tests only: a small workload (64 communities of one 64-row residency shard, short histories, a
// few candidates, 5 s of Steady at 100 requests/s) for the generator, trace and load generator
// tests; each test overrides what it needs.

#include <cstdint>

#include "absl/time/time.h"
#include "sim/workload/workload.h"

namespace hlem::sim::testing {

inline WorkloadConfig TinyWorkload(uint64_t seed = 1) {
  WorkloadConfig c;
  c.seed = seed;
  c.features = {{"item", 0, 64 * 64}, {"category", 1, 100}};
  c.communities = 64;
  c.residency_shard_rows = 64;
  c.users = 1000;
  c.hot_users = 50;
  c.history_min = 5;
  c.history_max = 20;
  c.candidates = 4;
  c.rate = 100;
  c.phases = {{.regime = Regime::kSteady, .duration = absl::Seconds(5)}};
  return c;
}

}  // namespace hlem::sim::testing
