#pragma once
// What things cost in the digital twin (ARCHITECTURE §8): one data file per device type under
// sim/costs/, with the measurements it was fitted from named in the file. The simulator runs the
// real caches and router; only time comes from here.
//
//   model step      step_overhead + Σ CachedForwardFlops(request) ÷ flops_per_second, on one
//                   compute unit (a core of the local machine, or a GPU);
//   per request     request_overhead + lookup_per_row × distinct rows looked up (KV bookkeeping,
//                   EMB lookups, gather, feature sums: CPU work of the node's worker);
//   shard fetch     fetch_overhead + fetch_per_row × rows, per table with misses (one RPC each);
//   device copy     the profile's link (bytes ÷ bandwidth + latency) plus copy_overhead per copy:
//                   what one transfer costs beyond the link itself (the cpu device's timer
//                   wake-up and hand-off; a GPU's copy launch);
//   router          router_overhead per request: the client → router → node → router → client
//                   hops and the routing decision (everything outside the node's own time).
//   background      background_cpu per request: CPU work the request causes outside the node
//                   stages above (the router, the client, the shards and the nodes' RPC
//                   threads), run on the shared compute units when the request arrives. It
//                   answers nothing; it takes capacity from the nodes' work, as those processes
//                   do on the local machine's cores (only with shared units: compute_units > 0).
// The host-to-device link is the profile's (node config: `memory.link`), not the device's.
//
// compute_units: how many model steps (and node CPU work) run at once across the whole cluster,
// as processor sharing (the local cluster's nodes share the machine's cores); 0 gives every node
// its own unit (a GPU per node). kv_dtype_bytes: how the device's runner stores K/V (the KV
// cache's page layout: tokens per page).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hlem::sim {

struct CostModel {
  std::string device = "cpu";  // what the figures describe
  std::string source;          // how they were measured or where they were published
  double flops_per_second = 40e9;
  absl::Duration step_overhead = absl::Microseconds(300);
  absl::Duration request_overhead = absl::Microseconds(100);
  absl::Duration lookup_per_row = absl::Nanoseconds(400);
  absl::Duration fetch_overhead = absl::Microseconds(400);
  absl::Duration fetch_per_row = absl::Nanoseconds(500);
  absl::Duration copy_overhead = absl::ZeroDuration();
  absl::Duration router_overhead = absl::Microseconds(1500);
  absl::Duration background_cpu = absl::ZeroDuration();
  // Per-request slowdown of the CPU stages (hops, node CPU work, fetches, the batch's step): the
  // stalls of a shared machine, as quantiles of its distribution at probabilities (i + 0.5) ÷ n,
  // fitted by `hlem sim fit` (median 1). Empty: no slowdown.
  std::vector<double> slowdown_quantiles;
  uint32_t compute_units = 2;
  uint32_t kv_dtype_bytes = 4;  // bytes per K/V element: the cpu runner stores fp32, a GPU bf16

  // Single-unit time of a model step of `flops` floating-point operations.
  absl::Duration StepTime(double flops) const {
    return step_overhead + absl::Nanoseconds(static_cast<int64_t>(flops / flops_per_second * 1e9));
  }
  absl::Duration FetchTime(uint64_t rows) const {
    return fetch_overhead + fetch_per_row * static_cast<int64_t>(rows);
  }
  // The slowdown of the request keyed by (user, events before it): a draw from
  // slowdown_quantiles by keyed randomness (the same request slows alike in every run).
  double Slowdown(uint64_t user, uint64_t prior_events) const;
};

// From YAML (sim/costs/*.yaml); errors name the field ("costs.flops_per_second: ...").
absl::StatusOr<CostModel> ParseCostModel(const std::string& yaml_text);
// NOT_FOUND for a missing file, otherwise as ParseCostModel.
absl::StatusOr<CostModel> LoadCostModel(const std::string& path);
// The model as YAML that ParseCostModel reads back (for result stamps).
std::string CostModelYaml(const CostModel& costs);

}  // namespace hlem::sim
