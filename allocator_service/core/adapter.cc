#include "allocator_service/core/adapter.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator_service/core/net.h"
#include "common/rng.h"

namespace hlem::allocator {
namespace {

constexpr int kAdapterInputs = 5;

// The local fit's regressors at α: (1, u, u²), u = α − mean.
std::array<double, 3> Phi(double mean, double alpha) {
  const double u = alpha - mean;
  return {1, u, u * u};
}
using Input = std::array<double, kAdapterInputs>;

Input AdapterInput(const WindowState& w) {
  const std::array<double, kNumFeatures> f = Features(w);
  // hot-user ratio, KV hit rate, EMB hit rate, P99 ÷ SLO, α; [0, 1] → [-1, 1].
  return {2 * f[0] - 1, 2 * f[1] - 1, 2 * f[2] - 1, 2 * f[6] - 1, 2 * f[5] - 1};
}

// Solves the 3 × 3 system a·c = b (Gaussian elimination with partial pivoting); false when
// singular.
bool Solve3(std::array<std::array<double, 3>, 3> a, std::array<double, 3> b,
            std::array<double, 3>& c) {
  for (int col = 0; col < 3; ++col) {
    int pivot = col;
    for (int r = col + 1; r < 3; ++r) {
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    }
    if (std::abs(a[pivot][col]) < 1e-12) return false;
    std::swap(a[pivot], a[col]);
    std::swap(b[pivot], b[col]);
    for (int r = col + 1; r < 3; ++r) {
      const double f = a[r][col] / a[col][col];
      for (int k = col; k < 3; ++k) a[r][k] -= f * a[col][k];
      b[r] -= f * b[col];
    }
  }
  for (int r = 2; r >= 0; --r) {
    double v = b[r];
    for (int k = r + 1; k < 3; ++k) v -= a[r][k] * c[k];
    c[r] = v / a[r][r];
  }
  return true;
}

class AdapterController final : public Controller {
 public:
  AdapterController(std::unique_ptr<Controller> base, const AdapterOptions& o)
      : base_(std::move(base)),
        o_(o),
        rng_(DeriveSeed(o.seed, "adapter")),
        net_({kAdapterInputs, o.hidden, 1}, /*out_gain=*/0.0, rng_),
        adam_(net_.size(), 0.0),
        grad_(net_.size()) {}

  std::string name() const override { return absl::StrCat(base_->name(), "+adapter"); }

  Decision Decide(std::span<const WindowState> history) override {
    const WindowState& now = history.back();
    pending_ = false;
    if (now.requests == 0) {
      return {.alpha = now.alpha, .reason = Reason::kHold, .detail = "no requests"};
    }
    // The base policy steers its own α (what PPO-only would have set), seeing the window as it
    // was with that α; the offset is added on top.
    // It re-anchors on the node's α when it did not decide the window before (the first window,
    // or after the recovery controller held the node: PPO resumes from the α recovery left).
    const bool continuing = have_base_ && now.index == last_index_ + 1;
    if (!continuing) base_alpha_ = now.alpha;
    have_base_ = true;
    last_index_ = now.index;
    scratch_.assign(history.begin(), history.end());
    scratch_.back().alpha = base_alpha_;
    Decision d = base_->Decide(scratch_);
    base_alpha_ = d.alpha;
    const Input x = AdapterInput(now);
    std::array<double, 1> z;
    net_.Forward(x, z, nullptr);
    const double offset = o_.max_offset * std::tanh(z[0]);
    // Dither when the recent αs are too close for the local fit to see a slope (not behind a
    // deadband: a move that small would be held).
    double dither = 0;
    if (o_.dither > 0 && o_.deadband == 0 && !FitLocalOptimum(history, o_).has_value()) {
      dither_sign_ = -dither_sign_;
      dither = dither_sign_ * o_.dither;
    }
    double alpha = o_.bounds.Clip(base_alpha_ + offset + dither);
    // The deadband: a move costs (refill, evicted K/V), so α moves only to a target at least
    // `deadband` from where it stands — the α this adapter set, or the node's when it did not
    // decide the window before.
    std::string held;
    if (o_.deadband > 0) {
      const double from = o_.bounds.Clip(continuing ? applied_ : now.alpha);
      if (std::abs(alpha - from) < o_.deadband) {
        held = absl::StrFormat(", held at %.2f (within the deadband %.2f)", from, o_.deadband);
        alpha = from;
        d.reason = Reason::kHold;
      }
    }
    applied_ = alpha;
    pending_ = true;
    pending_x_ = x;
    pending_base_ = base_alpha_;
    const size_t keep = std::min(history.size(), static_cast<size_t>(o_.fit_windows));
    recent_.assign(history.end() - static_cast<std::ptrdiff_t>(keep), history.end());
    d.detail = absl::StrFormat(
        "%s; adapter: base alpha %.2f, offset %+.3f%s%s: alpha %.2f", d.detail, base_alpha_, offset,
        dither != 0 ? absl::StrFormat(", dither %+.2f", dither) : "", held, alpha);
    d.alpha = alpha;
    return d;
  }

  void Learn() override {
    base_->Learn();
    if (!pending_) return;
    pending_ = false;
    const WindowState& now = recent_.back();
    double eta = 0;
    if (have_ema_) {
      eta = AdapterLearningRate(o_, now.p99_seconds, latency_ema_, now.slo_seconds);
      latency_ema_ += o_.latency_ema * (now.p99_seconds - latency_ema_);
    } else {
      latency_ema_ = now.p99_seconds;
      have_ema_ = true;
    }
    replay_.push_back({.x = pending_x_,
                       .base_alpha = pending_base_,
                       .hot_user_ratio = now.hot_user_ratio,
                       .seq_len_norm = now.mean_seq_len_norm});
    if (replay_.size() > o_.replay) replay_.pop_front();
    // Hindsight: what the windows of this workload show now labels the newest of its samples
    // (those the fit covers), including windows that could not be labelled when they closed.
    if (const std::optional<LocalOptimum> fit = FitLocalOptimum(recent_, o_); fit.has_value()) {
      const size_t n = std::min(replay_.size(), static_cast<size_t>(o_.fit_windows));
      for (size_t k = replay_.size() - n; k < replay_.size(); ++k) {
        Sample& s = replay_[k];
        if (!SameWorkload(s, now)) continue;
        s.labelled = true;
        s.y = fit->WorthMoving(s.base_alpha, o_)
                  ? std::clamp(fit->alpha - s.base_alpha, -o_.max_offset, o_.max_offset)
                  : 0.0;
      }
    }
    if (eta <= 0) return;
    labelled_.clear();
    for (size_t k = 0; k < replay_.size(); ++k) {
      if (replay_[k].labelled) labelled_.push_back(k);
    }
    if (labelled_.empty()) return;
    adam_.set_lr(eta);
    const size_t recent = std::min(labelled_.size(), o_.recent);
    TrainNet::Cache cache;
    for (int step = 0; step < o_.steps; ++step) {
      std::fill(grad_.begin(), grad_.end(), 0.0);
      for (size_t b = 0; b < o_.batch; ++b) {
        // Half of the batch from the newest labelled samples, half uniform over them all.
        const size_t span = b % 2 == 0 ? recent : labelled_.size();
        const Sample& s = replay_[labelled_[labelled_.size() - 1 - rng_() % span]];
        std::array<double, 1> z;
        net_.Forward(s.x, z, &cache);
        const double t = std::tanh(z[0]);
        const double err = o_.max_offset * t - s.y;
        const std::array<double, 1> dz = {err * o_.max_offset * (1 - t * t) /
                                          static_cast<double>(o_.batch)};
        net_.Backward(cache, dz, grad_);
      }
      adam_.Step(net_.params(), grad_);
    }
  }

 private:
  struct Sample {
    Input x;
    double base_alpha = 0;  // the base policy's α for the window after
    double hot_user_ratio = 0, seq_len_norm = 0;
    bool labelled = false;
    double y = 0;
  };
  bool SameWorkload(const Sample& s, const WindowState& w) const {
    const double dh = s.hot_user_ratio - w.hot_user_ratio,
                 ds = s.seq_len_norm - w.mean_seq_len_norm;
    return dh * dh + ds * ds <= o_.workload_sigma * o_.workload_sigma;
  }

  std::unique_ptr<Controller> base_;
  const AdapterOptions o_;
  Rng rng_;
  TrainNet net_;
  Adam adam_;
  std::vector<double> grad_;
  std::deque<Sample> replay_;
  std::vector<size_t> labelled_;  // replay indices with a label (Learn's scratch)
  bool pending_ = false;
  Input pending_x_{};
  double pending_base_ = 0;
  std::vector<WindowState> recent_;   // the windows the pending sample's label is fitted on
  std::vector<WindowState> scratch_;  // the history as the base policy sees it
  bool have_base_ = false;
  double base_alpha_ = 0;    // the base policy's own α
  double applied_ = 0;       // the α of the last decision
  uint64_t last_index_ = 0;  // the window of the last decision
  bool have_ema_ = false;
  double latency_ema_ = 0;
  double dither_sign_ = 1;
};

}  // namespace

double AdapterLearningRate(const AdapterOptions& o, double latency, double ema, double slo) {
  if (!(slo > 0) || !std::isfinite(latency) || !std::isfinite(ema)) return 0;
  return o.eta0 * std::min(std::abs(latency - ema) / slo, o.eta_cap);
}

std::optional<LocalOptimum> FitLocalOptimum(std::span<const WindowState> history,
                                            const AdapterOptions& o) {
  // Windows of another workload (a shift) say nothing about this one's optimum: each window's
  // weight is fit_decay^age times a Gaussian kernel of its distance to the newest in workload
  // (hot-user ratio, sequence length: what α does not move).
  const WindowState& now = history.back();
  std::vector<std::pair<double, double>> points;  // (α, weight), reward below
  std::vector<double> reward;
  double age_weight = 1;
  for (size_t k = 0; k < history.size() && k < static_cast<size_t>(o.fit_windows);
       ++k, age_weight *= o.fit_decay) {
    const WindowState& w = history[history.size() - 1 - k];
    if (w.requests == 0) continue;
    const double dh = w.hot_user_ratio - now.hot_user_ratio;
    const double ds = w.mean_seq_len_norm - now.mean_seq_len_norm;
    const double similar =
        std::exp(-(dh * dh + ds * ds) / (2 * o.workload_sigma * o.workload_sigma));
    if (similar < 1e-3) continue;
    points.push_back({w.alpha, age_weight * similar});
    reward.push_back(Reward(w));
  }
  double sw2 = 0, sw1 = 0;
  for (const auto& p : points) {
    sw1 += p.second;
    sw2 += p.second * p.second;
  }
  if (points.size() < 3 || sw1 * sw1 < 3 * sw2) return std::nullopt;  // effective size under 3
  double sw = 0, mean = 0, lo = 1, hi = 0;
  for (const auto& [alpha, w] : points) {
    sw += w;
    mean += w * alpha;
    lo = std::min(lo, alpha);
    hi = std::max(hi, alpha);
  }
  mean /= sw;
  double var = 0;
  for (const auto& [alpha, w] : points) var += w * (alpha - mean) * (alpha - mean);
  const double spread = std::sqrt(var / sw);
  if (spread < o.min_spread) return std::nullopt;
  // Weighted least squares of reward on u = α − mean: r ≈ c0 + c1·u + c2·u², a small ridge on c2
  // (two distinct αs leave the curvature undetermined: it then stays near 0, a linear fit).
  using Mat3 = std::array<std::array<double, 3>, 3>;
  const auto phi = [mean](double alpha) { return Phi(mean, alpha); };
  Mat3 a{}, a2{};  // Σ w·φφᵀ and Σ w²·φφᵀ
  std::array<double, 3> b{};
  for (size_t i = 0; i < points.size(); ++i) {
    const double w = points[i].second;
    const std::array<double, 3> f = phi(points[i].first);
    for (int r = 0; r < 3; ++r) {
      for (int k = 0; k < 3; ++k) {
        a[r][k] += w * f[r] * f[k];
        a2[r][k] += w * w * f[r] * f[k];
      }
      b[r] += w * f[r] * reward[i];
    }
  }
  a[2][2] += 1e-6 * sw;
  std::array<double, 3> c{};
  if (!Solve3(a, b, c)) return std::nullopt;
  LocalOptimum opt{.spread = spread, .mean = mean, .coef = c};
  // The coefficients' covariance, σ²·A⁻¹(Σ w²φφᵀ)A⁻¹, σ² from the weighted residuals (corrected
  // for the 3 coefficients; never under noise_floor²: three windows fit exactly).
  double rss = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    const std::array<double, 3> f = phi(points[i].first);
    const double e = reward[i] - (c[0] + c[1] * f[1] + c[2] * f[2]);
    rss += points[i].second * e * e;
  }
  const double n_eff = sw1 * sw1 / sw2;
  const double sigma2 =
      std::max(rss / sw * n_eff / std::max(n_eff - 3, 1.0), o.noise_floor * o.noise_floor);
  Mat3 inv{};
  for (int k = 0; k < 3; ++k) {
    std::array<double, 3> e{}, col{};
    e[k] = 1;
    if (!Solve3(a, e, col)) return std::nullopt;
    for (int r = 0; r < 3; ++r) inv[r][k] = col[r];
  }
  for (int r = 0; r < 3; ++r) {
    for (int k = 0; k < 3; ++k) {
      double v = 0;
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) v += inv[r][i] * a2[i][j] * inv[j][k];
      }
      opt.cov[r][k] = sigma2 * v;
    }
  }
  const double left = o.bounds.Clip(lo - o.reach), right = o.bounds.Clip(hi + o.reach);
  if (c[2] < 0) {
    opt.alpha = std::clamp(mean - c[1] / (2 * c[2]), left, right);
  } else {
    opt.alpha = left;
    if (opt.Gain(right) < 0) opt.alpha = right;  // Gain(right) = f(left) − f(right)
  }
  return opt;
}

double LocalOptimum::Gain(double from) const {
  const std::array<double, 3> pf = Phi(mean, from), pt = Phi(mean, alpha);
  double g = 0;
  for (int r = 0; r < 3; ++r) g += coef[r] * (pt[r] - pf[r]);
  return g;
}

double LocalOptimum::GainStderr(double from) const {
  const std::array<double, 3> pf = Phi(mean, from), pt = Phi(mean, alpha);
  double v = 0;
  for (int r = 0; r < 3; ++r) {
    for (int k = 0; k < 3; ++k) v += (pt[r] - pf[r]) * cov[r][k] * (pt[k] - pf[k]);
  }
  return std::sqrt(std::max(0.0, v));
}

bool LocalOptimum::WorthMoving(double from, const AdapterOptions& o) const {
  return Gain(from) >= std::max(o.min_gain, o.confidence * GainStderr(from));
}

absl::StatusOr<std::unique_ptr<Controller>> MakeAdapter(std::unique_ptr<Controller> base,
                                                        const AdapterOptions& o) {
  if (base == nullptr) return absl::InvalidArgumentError("adapter: no base controller");
  if (o.hidden == 0 || o.replay == 0 || o.batch == 0 || o.steps < 0 || o.fit_windows < 3) {
    return absl::InvalidArgumentError(
        "adapter: hidden, replay and batch must be positive, steps >= 0, fit_windows >= 3");
  }
  for (double v : {o.max_offset, o.eta0, o.eta_cap, o.latency_ema, o.fit_decay, o.min_spread,
                   o.dither, o.reach, o.min_gain, o.noise_floor, o.confidence, o.deadband}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError("adapter: rates, bounds and thresholds must be >= 0");
    }
  }
  if (o.max_offset > 1 || o.latency_ema > 1 || o.deadband > 1 || o.fit_decay > 1 ||
      o.fit_decay <= 0 || !o.bounds.Valid()) {
    return absl::InvalidArgumentError(
        "adapter: max_offset, latency_ema and deadband in [0, 1], fit_decay in (0, 1], 0 <= "
        "alpha_min <= alpha_max <= 1");
  }
  return std::unique_ptr<Controller>(std::make_unique<AdapterController>(std::move(base), o));
}

}  // namespace hlem::allocator
