#pragma once
// What a trace contains, measured from its requests alone (no generator state): arrival rate,
// the hot-user ratio per window by ARCHITECTURE §3's definition, how well a user's top-K
// residency shards cover its embedding lookups, and the item popularity exponent. `hlem workload
// stats` prints it; the generator's tests check it against the config.

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "sim/workload/workload.h"

namespace hlem::sim {

struct StatsOptions {
  uint64_t window_ns = 5'000'000'000;
  uint32_t hot_windows = 12;
  uint64_t residency_shard_rows = 4096;
  uint32_t top_k = 20;
  uint64_t community_rows = 4096;       // for the popularity fit: rank = item % community_rows
  uint64_t max_coverage_users = 20000;  // users whose histories are kept for the coverage
};

// The options that measure a trace of `config` (its window, horizon, residency shards and
// community size).
StatsOptions StatsOptionsFor(const WorkloadConfig& config);

struct WindowCount {
  uint64_t requests = 0, hot = 0;
  double hot_ratio() const { return requests == 0 ? 0 : static_cast<double>(hot) / requests; }
};

struct TraceStats {
  uint64_t requests = 0, users = 0, events = 0, candidates = 0;
  double duration_s = 0, rate = 0;
  double mean_history_events = 0;  // at each user's last request
  std::vector<WindowCount> windows;
  // Share of a user's embedding lookups (events × features) whose residency shard is among its
  // top_k shards: mean, and the 10th percentile over users with >= 100 events.
  double coverage_mean = 0, coverage_p10 = 0;
  uint64_t coverage_users = 0;
  // Least-squares slope of log(count) on log(rank) over item ranks 1..100 (rank = offset inside
  // the community): the Zipf exponent of item popularity.
  double item_zipf = 0;
};

class TraceAnalyzer {
 public:
  TraceAnalyzer(const StatsOptions& options, size_t features) : options_(options), F_(features) {}
  void Add(const TraceRequest& request);
  TraceStats Finish() const;

 private:
  const StatsOptions options_;
  const size_t F_;
  TraceStats stats_;
  uint64_t last_t_ = 0;
  absl::flat_hash_map<uint64_t, uint64_t> last_window_;  // user -> window of its last request
  absl::flat_hash_map<uint64_t, uint64_t> events_;       // user -> events so far
  // Per user kept for the coverage: lookups per (feature, residency shard).
  absl::flat_hash_map<uint64_t, absl::flat_hash_map<uint64_t, uint64_t>> shards_;
  std::vector<uint64_t> rank_counts_ = std::vector<uint64_t>(101, 0);
};

}  // namespace hlem::sim
