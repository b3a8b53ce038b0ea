#include "sim/twin/control.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "sim/twin/faults.h"

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

absl::StatusOr<ControlLoop> ControlLoop::Create(
    Twin& twin, const std::function<std::unique_ptr<allocator::Controller>()>& make,
    const ControlOptions& options) {
  if (options.window <= absl::ZeroDuration() || options.delay < absl::ZeroDuration() ||
      options.delay >= options.window || options.max_history == 0) {
    return absl::InvalidArgumentError(
        "control: window must be positive, delay in [0, window), max_history positive");
  }
  ControlLoop loop(twin, options);
  const size_t n = twin.num_nodes();
  loop.make_ = make;
  for (size_t i = 0; i < n; ++i) {
    loop.controllers_.push_back(make());
    if (loop.controllers_.back() == nullptr) {
      return absl::InvalidArgumentError("control: no controller");
    }
  }
  loop.history_.resize(n);
  loop.next_window_.assign(n, 0);
  loop.epochs_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) loop.epochs_[i] = twin.node_epoch(i);
  loop.alphas_.assign(n, twin.options().alpha);
  return loop;
}

void ControlLoop::Meet(size_t i) {
  controllers_[i] = make_();
  const std::vector<serving::NodeWindow> windows =
      twin_->node(i).node->Windows(options_.max_history);
  const uint64_t next = windows.empty() ? 0 : windows.back().index;
  if (twin_->node_epoch(i) == epochs_[i]) {
    undecided_ += next > next_window_[i] ? next - next_window_[i] : 0;  // closed while it was dead
  } else {
    epochs_[i] = twin_->node_epoch(i);
    alphas_[i] = twin_->options().alpha;  // a new incarnation starts at the configured α
  }
  std::vector<allocator::WindowState>& h = history_[i];
  h.clear();
  next_window_[i] = next;
  for (const serving::NodeWindow& w : windows) {
    if (w.index < next_window_[i]) h.push_back(ToWindowState(w));
  }
  while (h.size() + 1 > options_.max_history && !h.empty()) h.erase(h.begin());
}

absl::Status ControlLoop::Decide(std::vector<ControlRecord>* records) {
  if (AllocatorDownAt(twin_->options().faults, twin_->elapsed())) {
    allocator_down_ = true;
    return absl::OkStatus();
  }
  const bool restarted = std::exchange(allocator_down_, false);
  for (size_t i = 0; i < controllers_.size(); ++i) {
    if (!twin_->node_up(i)) continue;  // GetState fails: α held, nothing learnt
    if (restarted || twin_->node_epoch(i) != epochs_[i]) Meet(i);
    for (const serving::NodeWindow& w : twin_->node(i).node->Windows(options_.max_history)) {
      if (w.index < next_window_[i]) continue;
      next_window_[i] = w.index + 1;
      std::vector<allocator::WindowState>& h = history_[i];
      h.push_back(ToWindowState(w));
      if (h.size() > options_.max_history) h.erase(h.begin());
      const auto start = std::chrono::steady_clock::now();
      const allocator::Decision d = controllers_[i]->Decide(h);
      const auto decide_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - start)
                                 .count();
      RETURN_IF_ERROR(twin_->SetAlpha(i, d.alpha));
      alphas_[i] = d.alpha;
      controllers_[i]->Learn();  // off the decision path: after the α is applied
      records->push_back({.window = w.index,
                          .node = static_cast<uint32_t>(i),
                          .alpha = d.alpha,
                          .reason = d.reason,
                          .detail = d.detail,
                          .decide_ns = static_cast<uint64_t>(decide_ns)});
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ControlRecord>> RunControlled(
    Twin& twin, std::function<bool(TraceRequest*)> next,
    const std::function<std::unique_ptr<allocator::Controller>()>& make,
    const ControlOptions& options) {
  ASSIGN_OR_RETURN(ControlLoop loop, ControlLoop::Create(twin, make, options));
  std::vector<ControlRecord> records;
  RETURN_IF_ERROR(twin.Start(std::move(next)));
  for (int64_t k = 1; !twin.done(); ++k) {
    twin.RunUntil(options.window * k + options.delay);
    RETURN_IF_ERROR(loop.Decide(&records));
  }
  RETURN_IF_ERROR(twin.Finish());
  return records;
}

}  // namespace hlem::sim
