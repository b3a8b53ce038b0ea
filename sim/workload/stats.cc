#include "sim/workload/stats.h"

#include <algorithm>
#include <cmath>

namespace hlem::sim {

StatsOptions StatsOptionsFor(const WorkloadConfig& c) {
  return {.window_ns = static_cast<uint64_t>(absl::ToInt64Nanoseconds(c.window)),
          .hot_windows = c.hot_windows,
          .residency_shard_rows = c.residency_shard_rows,
          .community_rows = c.features[0].rows / c.communities};
}

void TraceAnalyzer::Add(const TraceRequest& r) {
  ++stats_.requests;
  last_t_ = r.t_ns;
  const uint64_t window = r.t_ns / options_.window_ns;
  if (stats_.windows.size() <= window) stats_.windows.resize(window + 1);
  WindowCount& w = stats_.windows[window];
  ++w.requests;
  auto [it, fresh] = last_window_.try_emplace(r.user, window);
  if (!fresh && it->second + options_.hot_windows >= window) ++w.hot;
  it->second = window;
  const uint64_t n = r.new_events.size() / F_;
  events_[r.user] += n;
  stats_.events += n;
  stats_.candidates += r.candidates.size() / F_;
  auto s = shards_.find(r.user);
  if (s == shards_.end() && shards_.size() < options_.max_coverage_users) {
    s = shards_.try_emplace(r.user).first;
  }
  for (uint64_t e = 0; e < n; ++e) {
    const uint64_t item = r.new_events[e * F_];
    const uint64_t rank = item % options_.community_rows + 1;
    if (rank < rank_counts_.size()) ++rank_counts_[rank];
    if (s == shards_.end()) continue;
    for (size_t f = 0; f < F_; ++f) {
      const uint64_t shard = r.new_events[e * F_ + f] / options_.residency_shard_rows;
      ++s->second[(static_cast<uint64_t>(f) << 48) | shard];
    }
  }
}

TraceStats TraceAnalyzer::Finish() const {
  TraceStats st = stats_;
  st.users = events_.size();
  st.duration_s = static_cast<double>(last_t_) / 1e9;
  st.rate = st.duration_s > 0 ? static_cast<double>(st.requests) / st.duration_s : 0;
  uint64_t total = 0;
  for (const auto& [user, n] : events_) total += n;
  st.mean_history_events = st.users == 0 ? 0 : static_cast<double>(total) / st.users;

  std::vector<double> coverage;
  std::vector<uint64_t> counts;
  for (const auto& [user, shards] : shards_) {
    auto e = events_.find(user);
    if (e == events_.end() || e->second < 100) continue;
    counts.clear();
    uint64_t all = 0;
    for (const auto& [key, c] : shards) {
      counts.push_back(c);
      all += c;
    }
    const size_t k = std::min<size_t>(options_.top_k, counts.size());
    std::partial_sort(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(k), counts.end(),
                      std::greater<>());
    uint64_t top = 0;
    for (size_t i = 0; i < k; ++i) top += counts[i];
    coverage.push_back(static_cast<double>(top) / static_cast<double>(all));
  }
  st.coverage_users = coverage.size();
  if (!coverage.empty()) {
    double sum = 0;
    for (double c : coverage) sum += c;
    st.coverage_mean = sum / static_cast<double>(coverage.size());
    std::sort(coverage.begin(), coverage.end());
    st.coverage_p10 = coverage[coverage.size() / 10];
  }

  // Zipf fit over the ranks with counts.
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  for (size_t rank = 1; rank < rank_counts_.size(); ++rank) {
    if (rank_counts_[rank] == 0) continue;
    const double x = std::log(static_cast<double>(rank));
    const double y = std::log(static_cast<double>(rank_counts_[rank]));
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
    ++n;
  }
  if (n >= 2) st.item_zipf = -(n * sxy - sx * sy) / (n * sxx - sx * sx);
  return st;
}

}  // namespace hlem::sim
