#include "allocator_service/lstm/lstm_controller.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/rng.h"

namespace hlem::allocator {
namespace {

class LstmController final : public Controller {
 public:
  explicit LstmController(const LstmOptions& o) : o_(o), rng_(DeriveSeed(o.seed, "lstm")) {
    torch::manual_seed(o.seed);
    lstm_ = torch::nn::LSTM(torch::nn::LSTMOptions(kNumFeatures, o.hidden).batch_first(true));
    head_ = torch::nn::Linear(o.hidden, 1);
    {
      torch::NoGradGuard no_grad;
      head_->weight.zero_();
      head_->bias.zero_();
    }
    std::vector<torch::Tensor> params = lstm_->parameters();
    for (const torch::Tensor& p : head_->parameters()) params.push_back(p);
    adam_ = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr));
  }
  std::string name() const override { return "lstm"; }

  Decision Decide(std::span<const WindowState> history) override {
    const WindowState& now = history.back();
    pending_ = false;
    const double held = o_.bounds.Clip(now.alpha);
    if (now.requests == 0) {
      last_dither_ = 0;
      return {.alpha = held, .reason = Reason::kHold, .detail = "no requests"};
    }
    std::vector<float> seq = Sequence(history);
    double step;
    {
      torch::NoGradGuard no_grad;
      step = Forward(torch::from_blob(seq.data(), {1, o_.sequence, kNumFeatures}).clone())
                 .item<double>();
    }
    double dither = 0;
    if (o_.dither > 0 && !FitLocalOptimum(history, o_.fit).has_value()) {
      dither_sign_ = -dither_sign_;
      dither = dither_sign_ * o_.dither;
    }
    // The model's own α: the dither of the last decision does not carry over (alternating around
    // held α, it would walk it instead of spreading it) — unless someone else set α since (the
    // recovery controller held the node: a gap in the windows decided).
    if (have_last_ && now.index != last_index_ + 1) last_dither_ = 0;
    have_last_ = true;
    last_index_ = now.index;
    const double base = o_.bounds.Clip(held - last_dither_);
    const double alpha = o_.bounds.Clip(base + step + dither);
    last_dither_ = alpha - o_.bounds.Clip(base + step);
    pending_ = true;
    pending_seq_ = std::move(seq);
    pending_alpha_ = base;
    const size_t keep = std::min(history.size(), static_cast<size_t>(o_.fit.fit_windows));
    recent_.assign(history.end() - static_cast<std::ptrdiff_t>(keep), history.end());
    return {.alpha = alpha,
            .reason = Reason::kBaseline,
            .detail = absl::StrFormat("lstm: step %+.3f%s: alpha %.2f -> %.2f", step,
                                      dither != 0 ? absl::StrFormat(", dither %+.2f", dither) : "",
                                      now.alpha, alpha)};
  }

  void Learn() override {
    if (!pending_) return;
    pending_ = false;
    const std::optional<LocalOptimum> fit = FitLocalOptimum(recent_, o_.fit);
    if (!fit.has_value()) return;
    const double target = fit->WorthMoving(pending_alpha_, o_.fit) ? fit->alpha : pending_alpha_;
    replay_.push_back(
        {std::move(pending_seq_),
         static_cast<float>(std::clamp(target - pending_alpha_, -o_.max_step, o_.max_step))});
    if (replay_.size() > o_.replay) replay_.pop_front();
    const size_t recent = std::min(replay_.size(), o_.recent);
    std::vector<float> x, y;
    for (int step = 0; step < o_.steps; ++step) {
      x.clear();
      y.clear();
      for (size_t b = 0; b < o_.batch; ++b) {
        const size_t span = b % 2 == 0 ? recent : replay_.size();
        const Sample& s = replay_[replay_.size() - 1 - rng_() % span];
        x.insert(x.end(), s.seq.begin(), s.seq.end());
        y.push_back(s.step);
      }
      const int64_t n = static_cast<int64_t>(o_.batch);
      const torch::Tensor input = torch::from_blob(x.data(), {n, o_.sequence, kNumFeatures});
      const torch::Tensor labels = torch::from_blob(y.data(), {n, 1});
      adam_->zero_grad();
      const torch::Tensor loss = torch::mse_loss(Forward(input), labels);
      loss.backward();
      adam_->step();
    }
  }

 private:
  struct Sample {
    std::vector<float> seq;  // sequence × features
    float step;              // the label: target α − α then
  };
  // The last `sequence` windows' features, oldest first; the oldest repeated when fewer exist.
  std::vector<float> Sequence(std::span<const WindowState> history) const {
    std::vector<float> seq;
    for (int k = o_.sequence - 1; k >= 0; --k) {
      const size_t back = std::min(static_cast<size_t>(k), history.size() - 1);
      for (double f : Features(history[history.size() - 1 - back])) {
        seq.push_back(static_cast<float>(f));
      }
    }
    return seq;
  }
  torch::Tensor Forward(const torch::Tensor& input) {
    const torch::Tensor out = std::get<0>(lstm_->forward(input));  // batch × sequence × hidden
    const torch::Tensor last = out.select(1, o_.sequence - 1);
    return o_.max_step * torch::tanh(head_->forward(last));
  }

  const LstmOptions o_;
  Rng rng_;
  torch::nn::LSTM lstm_{nullptr};
  torch::nn::Linear head_{nullptr};
  std::unique_ptr<torch::optim::Adam> adam_;
  std::deque<Sample> replay_;
  bool pending_ = false;
  std::vector<float> pending_seq_;
  double pending_alpha_ = 0;
  std::vector<WindowState> recent_;
  double dither_sign_ = 1;
  double last_dither_ = 0;
  bool have_last_ = false;
  uint64_t last_index_ = 0;  // the window of the last decision
};

}  // namespace

absl::StatusOr<std::unique_ptr<Controller>> MakeLstm(const LstmOptions& o) {
  if (o.sequence < 1 || o.sequence > 64 || o.hidden < 1 || o.hidden > 256 || o.replay < 1 ||
      o.batch < 1 || o.recent < 1 || o.steps < 0 || !(o.max_step > 0 && o.max_step <= 1) ||
      !(o.lr > 0) || !(o.dither >= 0) || !o.bounds.Valid() || o.fit.fit_windows < 3) {
    return absl::InvalidArgumentError(
        "lstm: sequence in [1, 64], hidden in [1, 256], replay, batch, recent >= 1, steps >= 0, "
        "max_step in (0, 1], lr > 0, dither >= 0, fit.fit_windows >= 3, 0 <= alpha_min <= "
        "alpha_max <= 1");
  }
  return std::unique_ptr<Controller>(std::make_unique<LstmController>(o));
}

}  // namespace hlem::allocator
