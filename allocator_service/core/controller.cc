#include "allocator_service/core/controller.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hlem::allocator {
namespace {

double Unit(double x) { return std::isfinite(x) ? std::clamp(x, 0.0, 1.0) : 0.0; }

class StaticController final : public Controller {
 public:
  explicit StaticController(double alpha) : alpha_(alpha) {}
  std::string name() const override { return absl::StrFormat("static(%.2f)", alpha_); }
  Decision Decide(std::span<const WindowState>) override {
    return {.alpha = alpha_, .reason = Reason::kStatic, .detail = "fixed"};
  }

 private:
  const double alpha_;
};

// EMA (weight 2 ÷ (n + 1)) and σ of P99 over the windows judged normal.
struct Baseline {
  double ema = 0, sigma = 0;
};
Baseline P99Baseline(const std::deque<double>& p99) {
  Baseline b;
  if (p99.empty()) return b;
  const double weight = 2.0 / static_cast<double>(p99.size() + 1);
  double mean = 0;
  b.ema = p99.front();
  for (size_t i = 0; i < p99.size(); ++i) {
    if (i > 0) b.ema += weight * (p99[i] - b.ema);
    mean += p99[i];
  }
  mean /= static_cast<double>(p99.size());
  double var = 0;
  for (double v : p99) var += (v - mean) * (v - mean);
  b.sigma = std::sqrt(var / static_cast<double>(p99.size()));
  return b;
}

class RecoveryController final : public Controller {
 public:
  RecoveryController(std::unique_ptr<Controller> inner, const RecoveryOptions& options)
      : inner_(std::move(inner)), o_(options) {}
  std::string name() const override { return absl::StrCat(inner_->name(), "+recovery"); }
  void Learn() override { inner_->Learn(); }

  Decision Decide(std::span<const WindowState> history) override {
    const WindowState& now = history.back();
    const bool judged = normal_.size() >= static_cast<size_t>(o_.history);
    const Baseline b = P99Baseline(normal_);
    const double bound = std::max(b.ema + o_.sigmas * b.sigma, o_.slo_fraction * now.slo_seconds);
    const bool over = judged && now.requests > 0 && now.p99_seconds > bound;
    if (!active_) {
      if (!over) {
        over_run_ = 0;
        Remember(now);
        return inner_->Decide(history);
      }
      if (++over_run_ == 1) {  // the first window over: the baseline before the incident
        frozen_ = b;
        fired_bound_ = bound;
      }
      if (over_run_ < o_.fire_windows) return inner_->Decide(history);
      active_ = true;
      below_ = 0;
    } else if (now.p99_seconds < frozen_.ema + frozen_.sigma) {
      Remember(now);
      if (++below_ >= o_.exit_windows) {
        active_ = false;
        over_run_ = 0;
        Decision d = inner_->Decide(history);
        d.detail = absl::StrCat("recovery ended; ", d.detail);
        return d;
      }
    } else {
      below_ = 0;
    }
    const double excess = fired_bound_ > 0 ? (now.p99_seconds - fired_bound_) / fired_bound_ : 0;
    const double step =
        now.hot_user_ratio > o_.hot_ratio ? o_.max_step * std::clamp(excess, 0.0, 1.0) : 0.0;
    const double alpha = o_.bounds.Clip(now.alpha - step);
    return {.alpha = alpha,
            .reason = Reason::kRecovery,
            .detail = absl::StrFormat(
                "P99 %.1f ms, bound %.1f ms, hot-user ratio %.2f: alpha %.2f -> %.2f",
                now.p99_seconds * 1e3, fired_bound_ * 1e3, now.hot_user_ratio, now.alpha, alpha)};
  }

 private:
  void Remember(const WindowState& w) {
    if (w.requests == 0) return;
    normal_.push_back(w.p99_seconds);
    if (normal_.size() > static_cast<size_t>(o_.history)) normal_.pop_front();
  }

  std::unique_ptr<Controller> inner_;
  const RecoveryOptions o_;
  std::deque<double> normal_;  // P99 of the last `history` windows judged normal
  int over_run_ = 0;           // consecutive windows over the bound
  bool active_ = false;
  int below_ = 0;
  Baseline frozen_;
  double fired_bound_ = 0;
};

class PolicyController final : public Controller {
 public:
  PolicyController(Mlp actor, const Bounds& bounds) : actor_(std::move(actor)), bounds_(bounds) {}
  std::string name() const override { return "policy"; }
  Decision Decide(std::span<const WindowState> history) override {
    const WindowState& now = history.back();
    const std::array<double, kNumFeatures> f = Features(now);
    std::array<float, kNumFeatures> x;
    for (int i = 0; i < kNumFeatures; ++i) x[i] = static_cast<float>(f[i]);
    std::array<float, kActions.size()> scores;
    actor_.Forward(x, scores);
    const size_t best =
        static_cast<size_t>(std::max_element(scores.begin(), scores.end()) - scores.begin());
    const double alpha = bounds_.Clip(now.alpha + kActions[best]);
    return {.alpha = alpha,
            .reason = Reason::kPolicy,
            .detail = absl::StrFormat("policy: action %+.2f: alpha %.2f -> %.2f", kActions[best],
                                      now.alpha, alpha)};
  }

 private:
  const Mlp actor_;
  const Bounds bounds_;
};

class PidController final : public Controller {
 public:
  explicit PidController(const PidOptions& options) : o_(options) {}
  std::string name() const override { return "pid"; }

  Decision Decide(std::span<const WindowState> history) override {
    const WindowState& now = history.back();
    if (now.requests == 0 || now.slo_seconds <= 0) {
      return {.alpha = o_.bounds.Clip(now.alpha), .reason = Reason::kHold, .detail = "no requests"};
    }
    const double e = (now.p99_seconds - o_.target_fraction * now.slo_seconds) / now.slo_seconds;
    if (have_last_) {
      const double moved = now.alpha - last_alpha_;
      const double changed = (now.p99_seconds - last_p99_) / now.slo_seconds;
      if (std::abs(moved) >= o_.min_move && std::abs(changed) >= o_.min_change) {
        direction_ = (moved > 0) == (changed > 0) ? 1 : -1;
      }
    }
    integral_ = std::clamp(integral_ + e, -o_.integral_limit, o_.integral_limit);
    const double derivative = have_last_ ? e - last_error_ : 0;
    const double u = o_.kp * e + o_.ki * integral_ + o_.kd * derivative;
    const double step = std::clamp(-direction_ * u, -o_.max_step, o_.max_step);
    const double alpha = o_.bounds.Clip(now.alpha + step);
    have_last_ = true;
    last_alpha_ = now.alpha;
    last_p99_ = now.p99_seconds;
    last_error_ = e;
    return {.alpha = alpha,
            .reason = Reason::kBaseline,
            .detail = absl::StrFormat("pid: error %.3f, integral %.3f, direction %+d: alpha %.2f "
                                      "-> %.2f",
                                      e, integral_, direction_, now.alpha, alpha)};
  }

 private:
  const PidOptions o_;
  bool have_last_ = false;
  double last_alpha_ = 0, last_p99_ = 0, last_error_ = 0, integral_ = 0;
  int direction_ = 1;  // sign of dP99/dα as last seen
};

}  // namespace

std::array<double, kNumFeatures> Features(const WindowState& w) {
  const double cap = w.p99_norm_cap > 0 ? w.p99_norm_cap : 1;
  const double p99_norm = w.slo_seconds > 0 ? std::min(w.p99_seconds / w.slo_seconds, cap) : cap;
  return {Unit(w.hot_user_ratio),
          Unit(w.kv_hit_rate),
          Unit(w.emb_hit_rate),
          Unit(w.mean_seq_len_norm),
          Unit(w.slo_violation_fraction),
          Unit(w.alpha),
          Unit(p99_norm / cap)};
}

double Reward(const WindowState& w) {
  const double satisfied = 1 - Unit(w.slo_violation_fraction);
  if (w.slo_seconds <= 0) return satisfied;
  const double cap = w.p99_norm_cap > 1 ? w.p99_norm_cap : 1;
  return satisfied - std::max(0.0, std::min(w.p99_seconds / w.slo_seconds, cap) - 1);
}

const char* ReasonName(Reason reason) {
  switch (reason) {
    case Reason::kStatic:
      return "static";
    case Reason::kHold:
      return "hold";
    case Reason::kPolicy:
      return "policy";
    case Reason::kRecovery:
      return "recovery";
    case Reason::kBaseline:
      return "baseline";
  }
  return "unknown";
}

double Bounds::Clip(double alpha) const { return std::clamp(alpha, alpha_min, alpha_max); }

bool Bounds::Valid() const { return alpha_min >= 0 && alpha_min <= alpha_max && alpha_max <= 1; }

std::unique_ptr<Controller> MakeStatic(double alpha) {
  return std::make_unique<StaticController>(alpha);
}

absl::StatusOr<std::unique_ptr<Controller>> MakePolicy(Mlp actor, const Bounds& bounds) {
  if (actor.inputs() != kNumFeatures || actor.outputs() != kActions.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy: the actor maps ", actor.inputs(), " inputs to ", actor.outputs(),
        " outputs; it must map ", kNumFeatures, " features to ", kActions.size(), " actions"));
  }
  if (!bounds.Valid()) {
    return absl::InvalidArgumentError("policy: 0 <= alpha_min <= alpha_max <= 1");
  }
  return std::unique_ptr<Controller>(std::make_unique<PolicyController>(std::move(actor), bounds));
}

absl::StatusOr<Mlp> LoadActor(const std::string& path) {
  absl::StatusOr<Mlp> actor = Mlp::Load(path);
  if (!actor.ok()) return actor.status();
  if (absl::StatusOr<std::unique_ptr<Controller>> check = MakePolicy(*actor); !check.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", check.status().message()));
  }
  return actor;
}

absl::StatusOr<std::unique_ptr<Controller>> MakePid(const PidOptions& o) {
  for (double v : {o.kp, o.ki, o.kd, o.max_step, o.integral_limit, o.min_move, o.min_change}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError("pid: gains, max_step and limits must be finite and >= 0");
    }
  }
  if (!(o.target_fraction > 0 && o.target_fraction <= 4) || !o.bounds.Valid()) {
    return absl::InvalidArgumentError(
        "pid: target_fraction in (0, 4], 0 <= alpha_min <= alpha_max <= 1");
  }
  return std::unique_ptr<Controller>(std::make_unique<PidController>(o));
}

absl::StatusOr<std::unique_ptr<Controller>> MakeRecovery(std::unique_ptr<Controller> inner,
                                                         const RecoveryOptions& o) {
  if (inner == nullptr) return absl::InvalidArgumentError("recovery: no inner controller");
  if (o.history < 2 || o.fire_windows < 1 || o.exit_windows < 1) {
    return absl::InvalidArgumentError(
        "recovery: history must be >= 2 and fire_windows, exit_windows >= 1");
  }
  if (!(o.max_step >= 0 && o.max_step <= 1) || !(o.sigmas >= 0) ||
      !(o.slo_fraction >= 0 && o.slo_fraction <= 10) || !o.bounds.Valid()) {
    return absl::InvalidArgumentError(
        "recovery: max_step in [0, 1], sigmas >= 0, slo_fraction in [0, 10], 0 <= alpha_min <= "
        "alpha_max <= 1");
  }
  return std::unique_ptr<Controller>(std::make_unique<RecoveryController>(std::move(inner), o));
}

}  // namespace hlem::allocator
