#pragma once
// Tests only: a small twin for TinyWorkload (sim/workload/workload_testing.h): four nodes with a
// 2 MiB pool on a slow link, the local model's shape, the local cost model's defaults.
// Generate and Feed turn a workload into the twin's input.

#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "sim/twin/twin.h"
#include "sim/workload/workload.h"

namespace hlem::sim::testing {

inline TwinOptions TinyTwin(const WorkloadConfig& workload) {
  TwinOptions t;
  serving::LocalNodeOptions& o = t.node.local;
  o.node.slo = absl::Milliseconds(25);
  o.node.window = absl::Seconds(1);
  o.pool_bytes = 2 << 20;
  o.page_bytes = 16 << 10;
  o.link = {.bytes_per_second = 3.2e6, .latency = absl::Microseconds(5)};
  o.residency_shard_rows = workload.residency_shard_rows;
  o.refill = {.chunk_bytes = 4 << 10,
              .max_copy_bytes = 4 << 10,
              .bytes_per_second = 0.8e6,
              .burst_bytes = 16 << 10};
  o.pipeline.max_history = 64;
  for (const FeatureTable& f : workload.features) {
    o.pipeline.features.push_back({.table_id = f.table_id, .rows = f.rows});
    o.tables.push_back({f.table_id, 64 * 4});
  }
  t.node.model = {.layers = 2, .dim = 64, .heads = 2, .d_qk = 32, .d_v = 32, .head_hidden = 64};
  t.nodes = 4;
  return t;
}

// Every request of the workload, in order.
inline std::vector<TraceRequest> Generate(const WorkloadConfig& config) {
  auto generator = WorkloadGenerator::Create(config);
  EXPECT_TRUE(generator.ok()) << generator.status();
  std::vector<TraceRequest> out;
  TraceRequest r;
  while ((*generator)->Next(&r)) out.push_back(r);
  return out;
}

// Yields the trace's requests in order (a copy: the twin may outlive the caller's vector).
inline std::function<bool(TraceRequest*)> Feed(const std::vector<TraceRequest>& trace) {
  return [trace, i = size_t{0}](TraceRequest* r) mutable {
    if (i == trace.size()) return false;
    *r = trace[i++];
    return true;
  };
}

}  // namespace hlem::sim::testing
