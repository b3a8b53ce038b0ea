// The router core's costs (issue 5; docs/perf/router.md): one routing decision (Algorithm 1 over
// every node, with the user's cached shard profile) at 32 and 256 nodes, K = 20, 10 000 active
// users; the shard profile of a 15 000-event history; the index memory with 6 000 resident users
// and 200 resident residency shards per node. No RPC: the service's overhead is measured with the
// service.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "router/core/cluster.h"

namespace hlem::router {
namespace {

constexpr uint64_t kShardRows = 4096;
constexpr uint64_t kItems = 1 << 24;

std::unique_ptr<Cluster> MakeCluster(int nodes, SimClock& clock) {
  ClusterOptions o;
  o.max_nodes = static_cast<uint32_t>(nodes);
  o.kv_filter_capacity = 6000;
  o.features = {{.table_id = 0, .residency_shard_rows = kShardRows},
                {.table_id = 1, .residency_shard_rows = 64}};
  o.speculative_ttl = absl::Milliseconds(1);  // steady state: speculative entries expire
  auto cluster = *Cluster::Create(o, clock);
  Rng rng(5);
  uint64_t user = 0;
  for (int n = 0; n < nodes; ++n) {
    const int node = *cluster->AddNode("node-" + std::to_string(n), "");
    serving::ResidencySnapshot s{.epoch = 1, .seq = 0, .load = {.load = 0.3}};
    for (int u = 0; u < 6000; ++u) s.users.push_back({user++ % 10000 * 7919 + n, 100});
    for (int k = 0; k < 200; ++k) s.shards.push_back({0, rng() % (kItems / kShardRows)});
    cluster->Reset(node, s);
  }
  return cluster;
}

std::vector<uint64_t> History(Rng& rng, size_t events) {
  ZipfSampler items(kItems, 1.0);
  std::vector<uint64_t> ids;
  for (size_t e = 0; e < events; ++e) {
    ids.push_back(items(rng));
    ids.push_back(rng() % 1000);
  }
  return ids;
}

// Route for 10 000 active users whose profiles are cached (delta requests with no new events:
// the decision alone).
void BM_Route(benchmark::State& state) {
  SimClock clock;
  auto cluster = MakeCluster(static_cast<int>(state.range(0)), clock);
  Rng rng(1);
  for (uint64_t u = 0; u < 10000; ++u) cluster->Route(u, History(rng, 64), false);
  // Steady state: every node reports its load (0.3) every 1 024 decisions (32 per node at 32
  // nodes), as it would every second; in between the router's own dispatch count raises the loads.
  std::vector<uint64_t> seq(static_cast<size_t>(state.range(0)), 0);
  uint64_t u = 0, i = 0;
  for (auto _ : state) {
    const RouteResult r = cluster->Route(u, {}, true);
    cluster->Completed(r.decision.node);
    u = (u + 1) % 10000;
    clock.AdvanceBy(absl::Microseconds(1));
    if (++i % 1024 == 0) {
      state.PauseTiming();
      for (int n = 0; n < static_cast<int>(seq.size()); ++n) {
        serving::ResidencyEvent e{.epoch = 1,
                                  .seq = ++seq[static_cast<size_t>(n)],
                                  .kind = serving::ResidencyEvent::Kind::kLoadReport};
        e.load.load = 0.3;
        (void)cluster->Apply(n, e);
      }
      state.ResumeTiming();
    }
  }
  // Percentiles of single decisions (each timed with steady_clock, ≈ 20 ns of timer included).
  std::vector<double> ns;
  ns.reserve(100000);
  for (int k = 0; k < 100000; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    const RouteResult r = cluster->Route(u, {}, true);
    const auto t1 = std::chrono::steady_clock::now();
    cluster->Completed(r.decision.node);
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    u = (u + 1) % 10000;
    if (k % 1024 == 1023) {
      for (int n = 0; n < static_cast<int>(seq.size()); ++n) {
        serving::ResidencyEvent e{.epoch = 1,
                                  .seq = ++seq[static_cast<size_t>(n)],
                                  .kind = serving::ResidencyEvent::Kind::kLoadReport};
        e.load.load = 0.3;
        (void)cluster->Apply(n, e);
      }
    }
  }
  std::sort(ns.begin(), ns.end());
  state.counters["p50_ns"] = ns[ns.size() / 2];
  state.counters["p99_ns"] = ns[ns.size() * 99 / 100];
  state.counters["index_KiB_per_node"] = static_cast<double>(cluster->Stats().index_bytes) / 1024 /
                                         static_cast<double>(state.range(0));
}
BENCHMARK(BM_Route)->ArgName("nodes")->Arg(32)->Arg(256);

void BM_ProfileBuild(benchmark::State& state) {
  Rng rng(2);
  const std::vector<uint64_t> ids = History(rng, static_cast<size_t>(state.range(0)));
  const std::vector<FeatureShards> features = {{0, kShardRows}, {1, 64}};
  for (auto _ : state) benchmark::DoNotOptimize(ShardProfile::Build(ids, features, 20));
}
BENCHMARK(BM_ProfileBuild)->ArgName("events")->Arg(512)->Arg(15000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace hlem::router

BENCHMARK_MAIN();
