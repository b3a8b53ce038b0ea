#include "allocator_service/core/bayes_opt.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace hlem::allocator {
namespace {

class BayesOptController final : public Controller {
 public:
  explicit BayesOptController(const BayesOptOptions& o) : o_(o) {}
  std::string name() const override { return "bo"; }

  Decision Decide(std::span<const WindowState> history) override {
    const WindowState& now = history.back();
    std::vector<const WindowState*> data;
    for (size_t k = history.size(); k-- > 0 && data.size() < static_cast<size_t>(o_.windows);) {
      if (history[k].requests > 0) data.push_back(&history[k]);
    }
    const double held = o_.bounds.Clip(now.alpha);
    if (now.requests == 0 || data.size() < 2) {
      return {.alpha = held, .reason = Reason::kHold, .detail = "bo: too few windows to fit"};
    }
    const int n = static_cast<int>(data.size());
    Eigen::VectorXd y(n);
    for (int i = 0; i < n; ++i) y(i) = Reward(*data[i]);
    const double mean = y.mean();
    const double sd = std::max(std::sqrt((y.array() - mean).square().mean()), o_.min_reward_std);
    y = (y.array() - mean) / sd;
    Eigen::MatrixXd k(n, n);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        k(i, j) = Kernel(data[i]->alpha, *data[i], data[j]->alpha, *data[j]);
      }
      k(i, i) += o_.noise;
    }
    const Eigen::LLT<Eigen::MatrixXd> llt(k);
    if (llt.info() != Eigen::Success) {
      return {.alpha = held, .reason = Reason::kHold, .detail = "bo: kernel matrix not positive"};
    }
    const Eigen::VectorXd weights = llt.solve(y);
    // best: the highest posterior mean at the windows fitted.
    double best = -1e300;
    for (int i = 0; i < n; ++i) {
      Eigen::VectorXd ks(n);
      for (int j = 0; j < n; ++j) ks(j) = k(i, j) - (i == j ? o_.noise : 0.0);
      best = std::max(best, ks.dot(weights));
    }
    double pick = held, pick_ei = -1, pick_mu = 0;
    const double lo = std::max(o_.bounds.alpha_min, held - o_.max_step);
    const double hi = std::min(o_.bounds.alpha_max, held + o_.max_step);
    const int steps = static_cast<int>(std::floor((hi - lo) / o_.grid_step + 1e-9));
    Eigen::VectorXd ks(n);
    for (int g = 0; g <= steps; ++g) {
      const double a = lo + g * o_.grid_step;
      for (int j = 0; j < n; ++j) ks(j) = Kernel(a, now, data[j]->alpha, *data[j]);
      const double mu = ks.dot(weights);
      const double var = std::max(1e-12, 1.0 - ks.dot(llt.solve(ks)));
      const double sigma = std::sqrt(var);
      const double improve = mu - best - o_.xi;
      const double z = improve / sigma;
      const double ei = improve * 0.5 * std::erfc(-z / std::sqrt(2.0)) +
                        sigma * std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
      if (ei > pick_ei) {
        pick_ei = ei;
        pick = a;
        pick_mu = mu;
      }
    }
    pick = o_.bounds.Clip(pick);
    return {
        .alpha = pick,
        .reason = Reason::kBaseline,
        .detail = absl::StrFormat("bo: %d windows, EI %.3g at alpha %.2f (mean %+.2f sd): alpha "
                                  "%.2f -> %.2f",
                                  n, pick_ei, pick, pick_mu, now.alpha, pick)};
  }

 private:
  double Kernel(double a1, const WindowState& w1, double a2, const WindowState& w2) const {
    const double da = (a1 - a2) / o_.alpha_scale;
    const double dh = (w1.hot_user_ratio - w2.hot_user_ratio) / o_.context_scale;
    const double ds = (w1.mean_seq_len_norm - w2.mean_seq_len_norm) / o_.context_scale;
    return std::exp(-0.5 * (da * da + dh * dh + ds * ds));
  }

  const BayesOptOptions o_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Controller>> MakeBayesOpt(const BayesOptOptions& o) {
  if (o.windows < 2 || !(o.alpha_scale > 0) || !(o.context_scale > 0) || !(o.noise > 0) ||
      !(o.xi >= 0) || !(o.grid_step > 0) || !(o.max_step > 0) || !(o.min_reward_std > 0) ||
      !o.bounds.Valid()) {
    return absl::InvalidArgumentError(
        "bo: windows >= 2; scales, noise, grid_step, max_step, min_reward_std > 0; xi >= 0; 0 <= "
        "alpha_min <= alpha_max <= 1");
  }
  return std::unique_ptr<Controller>(std::make_unique<BayesOptController>(o));
}

}  // namespace hlem::allocator
