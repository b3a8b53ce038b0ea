#include "allocator_service/core/milp.h"

#include <glpk.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace hlem::allocator {
namespace {

// GLPK problem, deleted on every path.
struct Problem {
  glp_prob* p = glp_create_prob();
  ~Problem() { glp_delete_prob(p); }
};

class MilpController final : public Controller {
 public:
  explicit MilpController(const MilpOptions& o) : o_(o) {
    const double span = o.bounds.alpha_max - o.bounds.alpha_min;
    const int k = std::max(1, static_cast<int>(std::ceil(span / o.breakpoint_step - 1e-9)));
    for (int i = 0; i <= k; ++i) {
      breaks_.push_back(i == k ? o.bounds.alpha_max : o.bounds.alpha_min + i * o.breakpoint_step);
    }
  }
  std::string name() const override { return "milp"; }

  Decision Decide(std::span<const WindowState> history) override {
    const WindowState& now = history.back();
    const double held = o_.bounds.Clip(now.alpha);
    if (now.requests == 0) return {.alpha = held, .reason = Reason::kHold, .detail = "no requests"};
    std::vector<double> values;
    double spread = 0;
    const int fitted = Fit(history, values, spread);
    if (fitted < o_.min_windows || spread < o_.min_spread) {
      dither_sign_ = -dither_sign_;
      const double alpha = o_.bounds.Clip(held + dither_sign_ * o_.dither);
      return {.alpha = alpha,
              .reason = Reason::kBaseline,
              .detail = absl::StrFormat("milp: %d windows of this workload, alpha spread %.3f: "
                                        "exploring: alpha %.2f -> %.2f",
                                        fitted, spread, now.alpha, alpha)};
    }
    const std::optional<double> solved = Solve(values, held);
    if (!solved.has_value()) {
      return {.alpha = held, .reason = Reason::kHold, .detail = "milp: no solution (held)"};
    }
    return {.alpha = *solved,
            .reason = Reason::kBaseline,
            .detail =
                absl::StrFormat("milp: %d windows, model P99/SLO %.2f at alpha %.2f: alpha "
                                "%.2f -> %.2f",
                                fitted, Interpolate(values, *solved), *solved, now.alpha, *solved)};
  }

 private:
  // Hat-function weights of α over the breakpoints.
  std::vector<double> Hats(double alpha) const {
    std::vector<double> phi(breaks_.size(), 0.0);
    alpha = std::clamp(alpha, breaks_.front(), breaks_.back());
    for (size_t k = 0; k + 1 < breaks_.size(); ++k) {
      if (alpha <= breaks_[k + 1]) {
        const double t = (alpha - breaks_[k]) / (breaks_[k + 1] - breaks_[k]);
        phi[k] = 1 - t;
        phi[k + 1] = t;
        break;
      }
    }
    return phi;
  }
  double Interpolate(const std::vector<double>& v, double alpha) const {
    const std::vector<double> phi = Hats(alpha);
    double y = 0;
    for (size_t k = 0; k < v.size(); ++k) y += phi[k] * v[k];
    return y;
  }

  // The model's values at the breakpoints; returns the windows of this workload fitted and the
  // weighted standard deviation of their α.
  int Fit(std::span<const WindowState> history, std::vector<double>& v, double& spread) const {
    const WindowState& now = history.back();
    const int n = static_cast<int>(breaks_.size());
    Eigen::MatrixXd a = Eigen::MatrixXd::Zero(n, n);
    Eigen::VectorXd b = Eigen::VectorXd::Zero(n);
    double age_weight = 1, sw = 0, swy = 0, swa = 0, swaa = 0;
    int fitted = 0, seen = 0;
    for (size_t k = history.size(); k-- > 0 && seen < o_.windows; age_weight *= o_.fit_decay) {
      const WindowState& w = history[k];
      if (w.requests == 0 || w.slo_seconds <= 0) continue;
      ++seen;
      const double dh = w.hot_user_ratio - now.hot_user_ratio;
      const double ds = w.mean_seq_len_norm - now.mean_seq_len_norm;
      const double weight =
          age_weight * std::exp(-(dh * dh + ds * ds) / (2 * o_.workload_sigma * o_.workload_sigma));
      if (weight < 1e-3) continue;
      ++fitted;
      const double cap = w.p99_norm_cap > 1 ? w.p99_norm_cap : 4;
      const double y = std::min(w.p99_seconds / w.slo_seconds, cap);
      const std::vector<double> phi = Hats(w.alpha);
      for (int r = 0; r < n; ++r) {
        for (int c = 0; c < n; ++c) a(r, c) += weight * phi[r] * phi[c];
        b(r) += weight * phi[r] * y;
      }
      sw += weight;
      swy += weight * y;
      swa += weight * w.alpha;
      swaa += weight * w.alpha * w.alpha;
    }
    if (fitted == 0) return 0;
    spread = std::sqrt(std::max(0.0, swaa / sw - (swa / sw) * (swa / sw)));
    for (int k = 1; k + 1 < n; ++k) {  // smoothness: Σ (v_{k-1} − 2v_k + v_{k+1})²
      const int idx[3] = {k - 1, k, k + 1};
      const double coef[3] = {1, -2, 1};
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 3; ++c) a(idx[r], idx[c]) += o_.smoothness * coef[r] * coef[c];
      }
    }
    const double mean = swy / sw;
    for (int k = 0; k < n; ++k) {
      a(k, k) += 1e-6;
      b(k) += 1e-6 * mean;
    }
    const Eigen::VectorXd x = a.ldlt().solve(b);
    v.assign(x.data(), x.data() + n);
    for (double& y : v) {
      if (!std::isfinite(y)) y = mean;
    }
    return fitted;
  }

  std::optional<double> Solve(const std::vector<double>& v, double now) const {
    const int n = static_cast<int>(breaks_.size());  // λ: columns 1..n
    const int segments = n - 1;                      // z: columns n+1..n+segments
    const int d = n + segments + 1;                  // d: the last column
    Problem prob;
    glp_set_obj_dir(prob.p, GLP_MIN);
    glp_add_cols(prob.p, d);
    for (int k = 1; k <= n; ++k) {
      glp_set_col_bnds(prob.p, k, GLP_DB, 0.0, 1.0);
      glp_set_obj_coef(prob.p, k, v[k - 1]);
    }
    for (int s = 1; s <= segments; ++s) glp_set_col_kind(prob.p, n + s, GLP_BV);
    glp_set_col_bnds(prob.p, d, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(prob.p, d, o_.switch_cost);
    std::vector<int> ia = {0}, ja = {0};
    std::vector<double> ar = {0};
    int row = 0;
    const auto add = [&](int col, double value) {
      ia.push_back(row);
      ja.push_back(col);
      ar.push_back(value);
    };
    const auto new_row = [&](int type, double lo, double hi) {
      row = glp_add_rows(prob.p, 1);
      glp_set_row_bnds(prob.p, row, type, lo, hi);
    };
    new_row(GLP_FX, 1, 1);  // Σλ = 1
    for (int k = 1; k <= n; ++k) add(k, 1);
    new_row(GLP_FX, 1, 1);  // Σz = 1
    for (int s = 1; s <= segments; ++s) add(n + s, 1);
    for (int k = 0; k < n; ++k) {  // λ_k ≤ z_(k−1) + z_k
      new_row(GLP_UP, 0, 0);
      add(k + 1, 1);
      if (k >= 1) add(n + k, -1);
      if (k < segments) add(n + k + 1, -1);
    }
    const double lo = std::max(breaks_.front(), now - o_.max_step);
    const double hi = std::min(breaks_.back(), now + o_.max_step);
    new_row(lo < hi ? GLP_DB : GLP_FX, lo, hi);  // the trust region on α = Σλb
    for (int k = 1; k <= n; ++k) add(k, breaks_[k - 1]);
    new_row(GLP_UP, 0, now);  // α − d ≤ now
    for (int k = 1; k <= n; ++k) add(k, breaks_[k - 1]);
    add(d, -1);
    new_row(GLP_LO, now, 0);  // α + d ≥ now
    for (int k = 1; k <= n; ++k) add(k, breaks_[k - 1]);
    add(d, 1);
    glp_load_matrix(prob.p, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    if (glp_intopt(prob.p, &parm) != 0) return std::nullopt;
    const int status = glp_mip_status(prob.p);
    if (status != GLP_OPT && status != GLP_FEAS) return std::nullopt;
    double alpha = 0;
    for (int k = 1; k <= n; ++k) alpha += glp_mip_col_val(prob.p, k) * breaks_[k - 1];
    return o_.bounds.Clip(alpha);
  }

  const MilpOptions o_;
  std::vector<double> breaks_;
  double dither_sign_ = 1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Controller>> MakeMilp(const MilpOptions& o) {
  if (o.windows < 1 || o.min_windows < 1 || !(o.fit_decay > 0 && o.fit_decay <= 1) ||
      !(o.workload_sigma > 0) || !(o.breakpoint_step >= 0.01 && o.breakpoint_step <= 1) ||
      !(o.smoothness >= 0) || !(o.switch_cost >= 0) || !(o.max_step > 0) || !(o.dither >= 0) ||
      !o.bounds.Valid()) {
    return absl::InvalidArgumentError(
        "milp: windows, min_windows >= 1; fit_decay in (0, 1]; workload_sigma, max_step > 0; "
        "breakpoint_step in [0.01, 1]; smoothness, switch_cost, dither >= 0; 0 <= alpha_min <= "
        "alpha_max <= 1");
  }
  return std::unique_ptr<Controller>(std::make_unique<MilpController>(o));
}

}  // namespace hlem::allocator
