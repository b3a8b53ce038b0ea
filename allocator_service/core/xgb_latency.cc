#include "allocator_service/core/xgb_latency.h"

#include <xgboost/c_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hlem::allocator {
namespace {

constexpr int kColumns = kNumFeatures + 1;  // window t's features, α_(t+1)
using Row = std::array<float, kColumns>;

// An XGBoost handle freed on every path.
template <typename Handle, int (*Free)(Handle)>
struct Owned {
  Handle h = nullptr;
  ~Owned() {
    if (h != nullptr) Free(h);
  }
};
using Matrix = Owned<DMatrixHandle, XGDMatrixFree>;
using Booster = Owned<BoosterHandle, XGBoosterFree>;

Row MakeRow(const WindowState& w, double next_alpha) {
  const std::array<double, kNumFeatures> f = Features(w);
  Row r;
  for (int i = 0; i < kNumFeatures; ++i) r[i] = static_cast<float>(f[i]);
  r[kNumFeatures] = static_cast<float>(next_alpha);
  return r;
}

class XgbController final : public Controller {
 public:
  explicit XgbController(const XgbOptions& o) : o_(o) {}
  std::string name() const override { return "xgboost"; }

  Decision Decide(std::span<const WindowState> history) override {
    const WindowState& now = history.back();
    const double held = o_.bounds.Clip(now.alpha);
    // The transition that just closed: the previous window's state and the α this one ran at.
    if (have_last_ && now.requests > 0 && now.slo_seconds > 0) {
      const double cap = now.p99_norm_cap > 1 ? now.p99_norm_cap : 4;
      samples_.push_back({MakeRow(last_, now.alpha),
                          static_cast<float>(std::min(now.p99_seconds / now.slo_seconds, cap))});
      if (samples_.size() > o_.samples) samples_.pop_front();
      ++since_training_;
    }
    last_ = now;
    have_last_ = now.requests > 0;
    if (now.requests == 0) return {.alpha = held, .reason = Reason::kHold, .detail = "no requests"};
    if (model_.h == nullptr || !Varied()) {
      dither_sign_ = -dither_sign_;
      const double alpha = o_.bounds.Clip(held + dither_sign_ * o_.dither);
      return {.alpha = alpha,
              .reason = Reason::kBaseline,
              .detail = absl::StrFormat("xgboost: %zu samples, exploring: alpha %.2f -> %.2f",
                                        samples_.size(), now.alpha, alpha)};
    }
    std::vector<float> rows;
    std::vector<double> candidates;
    for (double a : kActions) {
      const double c = o_.bounds.Clip(held + a);
      if (std::find(candidates.begin(), candidates.end(), c) != candidates.end()) continue;
      candidates.push_back(c);
      const Row r = MakeRow(now, c);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    Matrix m;
    bst_ulong len = 0;
    const float* out = nullptr;
    if (XGDMatrixCreateFromMat(rows.data(), candidates.size(), kColumns, NAN, &m.h) != 0 ||
        XGBoosterPredict(model_.h, m.h, 0, 0, 0, &len, &out) != 0 || len != candidates.size()) {
      return {.alpha = held,
              .reason = Reason::kHold,
              .detail = absl::StrCat("xgboost: predict failed (held): ", XGBGetLastError())};
    }
    std::vector<double> score(candidates.size());
    for (size_t i = 0; i < candidates.size(); ++i) {
      double nearest = 1;
      for (const Sample& smp : samples_) {
        nearest = std::min(nearest, std::abs(candidates[i] - smp.row[kNumFeatures]));
      }
      score[i] = out[i] - o_.explore_bonus * std::min(1.0, nearest / o_.explore_scale);
    }
    size_t best = 0;
    for (size_t i = 1; i < candidates.size(); ++i) {
      const bool lower = score[i] < score[best] - 1e-6;
      const bool tie_smaller_move =
          std::abs(score[i] - score[best]) <= 1e-6 &&
          std::abs(candidates[i] - held) < std::abs(candidates[best] - held);
      if (lower || tie_smaller_move) best = i;
    }
    return {.alpha = candidates[best],
            .reason = Reason::kBaseline,
            .detail = absl::StrFormat("xgboost: %zu samples, predicted P99/SLO %.2f at alpha %.2f: "
                                      "alpha %.2f -> %.2f",
                                      samples_.size(), out[best], candidates[best], now.alpha,
                                      candidates[best])};
  }

  void Learn() override {
    if (samples_.size() < o_.min_samples || since_training_ < o_.retrain_every) return;
    since_training_ = 0;
    std::vector<float> x, y;
    for (const Sample& s : samples_) {
      x.insert(x.end(), s.row.begin(), s.row.end());
      y.push_back(s.label);
    }
    Matrix m;
    Booster b;
    if (XGDMatrixCreateFromMat(x.data(), samples_.size(), kColumns, NAN, &m.h) != 0 ||
        XGDMatrixSetFloatInfo(m.h, "label", y.data(), y.size()) != 0 ||
        XGBoosterCreate(&m.h, 1, &b.h) != 0) {
      return;  // the previous model stays
    }
    const std::string depth = std::to_string(o_.max_depth), eta = absl::StrCat(o_.eta),
                      seed = std::to_string(o_.seed);
    for (const auto& [k, v] : {std::pair{"objective", "reg:squarederror"},
                               {"nthread", "1"},
                               {"verbosity", "0"},
                               {"max_depth", depth.c_str()},
                               {"eta", eta.c_str()},
                               {"seed", seed.c_str()}}) {
      if (XGBoosterSetParam(b.h, k, v) != 0) return;
    }
    for (int i = 0; i < o_.rounds; ++i) {
      if (XGBoosterUpdateOneIter(b.h, i, m.h) != 0) return;
    }
    std::swap(model_.h, b.h);
  }

 private:
  struct Sample {
    Row row;
    float label;
  };
  // Whether the samples' next α vary enough for the model to say anything about α.
  bool Varied() const {
    double lo = 1, hi = 0;
    for (const Sample& s : samples_) {
      lo = std::min(lo, static_cast<double>(s.row[kNumFeatures]));
      hi = std::max(hi, static_cast<double>(s.row[kNumFeatures]));
    }
    return hi - lo >= o_.min_spread;
  }

  const XgbOptions o_;
  std::deque<Sample> samples_;
  int since_training_ = 0;
  bool have_last_ = false;
  WindowState last_;
  Booster model_;
  double dither_sign_ = 1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Controller>> MakeXgbLatency(const XgbOptions& o) {
  if (o.samples < 2 || o.min_samples < 2 || o.min_samples > o.samples || o.retrain_every < 1 ||
      o.rounds < 1 || o.max_depth < 1 || o.max_depth > 12 || !(o.eta > 0 && o.eta <= 1) ||
      !(o.min_spread >= 0) || !(o.dither >= 0) || !(o.explore_bonus >= 0) ||
      !(o.explore_scale > 0) || !o.bounds.Valid()) {
    return absl::InvalidArgumentError(
        "xgboost: 2 <= min_samples <= samples; retrain_every, rounds >= 1; max_depth in [1, 12]; "
        "eta in (0, 1]; min_spread, dither, explore_bonus >= 0; explore_scale > 0; 0 <= alpha_min "
        "<= alpha_max <= 1");
  }
  return std::unique_ptr<Controller>(std::make_unique<XgbController>(o));
}

}  // namespace hlem::allocator
