#include "sim/twin/control.h"

#include <utility>

#include "absl/status/status.h"
#include "common/status_macros.h"

namespace hlem::sim {

allocator::WindowState ToWindowState(const serving::NodeWindow& w) {
  return {.index = w.index,
          .requests = w.requests,
          .hot_user_ratio = w.hot_user_ratio,
          .kv_hit_rate = w.kv_hit_rate,
          .emb_hit_rate = w.emb_hit_rate,
          .mean_seq_len_norm = w.mean_seq_len_norm,
          .slo_violation_fraction = w.slo_violation_fraction,
          .alpha = w.alpha_effective,
          .p99_seconds = w.p99_seconds,
          .slo_seconds = w.slo_seconds,
          .p99_norm_cap = w.p99_norm_cap > 0 ? w.p99_norm_cap : 4};
}

absl::StatusOr<std::vector<ControlRecord>> RunControlled(
    Twin& twin, std::function<bool(TraceRequest*)> next,
    const std::function<std::unique_ptr<allocator::Controller>()>& make,
    const ControlOptions& options) {
  if (options.window <= absl::ZeroDuration() || options.delay < absl::ZeroDuration() ||
      options.delay >= options.window || options.max_history == 0) {
    return absl::InvalidArgumentError(
        "control: window must be positive, delay in [0, window), max_history positive");
  }
  const size_t n = twin.num_nodes();
  std::vector<std::unique_ptr<allocator::Controller>> controllers;
  for (size_t i = 0; i < n; ++i) {
    controllers.push_back(make());
    if (controllers.back() == nullptr) return absl::InvalidArgumentError("control: no controller");
  }
  std::vector<std::vector<allocator::WindowState>> history(n);
  std::vector<uint64_t> next_window(n, 0);  // the first window index not yet decided on
  std::vector<ControlRecord> records;
  RETURN_IF_ERROR(twin.Start(std::move(next)));
  for (int64_t k = 1; !twin.done(); ++k) {
    twin.RunUntil(options.window * k + options.delay);
    for (size_t i = 0; i < n; ++i) {
      for (const serving::NodeWindow& w : twin.node(i).node->Windows(options.max_history)) {
        if (w.index < next_window[i]) continue;
        next_window[i] = w.index + 1;
        std::vector<allocator::WindowState>& h = history[i];
        h.push_back(ToWindowState(w));
        if (h.size() > options.max_history) h.erase(h.begin());
        const allocator::Decision d = controllers[i]->Decide(h);
        RETURN_IF_ERROR(twin.SetAlpha(i, d.alpha));
        controllers[i]->Learn();  // off the decision path: after the α is applied
        records.push_back({.window = w.index,
                           .node = static_cast<uint32_t>(i),
                           .alpha = d.alpha,
                           .reason = d.reason,
                           .detail = d.detail});
      }
    }
  }
  RETURN_IF_ERROR(twin.Finish());
  return records;
}

}  // namespace hlem::sim
