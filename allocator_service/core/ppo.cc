#include "allocator_service/core/ppo.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace hlem::allocator {
namespace {

constexpr double kMinStd = 1e-2;  // of a normalised input (a feature that never moves)

std::vector<uint32_t> Sizes(uint32_t in, const std::vector<uint32_t>& hidden, uint32_t out) {
  std::vector<uint32_t> s = {in};
  s.insert(s.end(), hidden.begin(), hidden.end());
  s.push_back(out);
  return s;
}

// Softmax of the scores in place; returns log Σ exp.
double Softmax(std::vector<double>& x) {
  const double top = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (double& v : x) sum += (v = std::exp(v - top));
  for (double& v : x) v /= sum;
  return top + std::log(sum);
}

}  // namespace

std::string PpoOptions::Describe() const {
  return absl::StrFormat(
      "hidden %s, gamma %g, lambda %g, clip %g, lr %g, entropy %g, value_coef %g, max_grad_norm "
      "%g, epochs %d, minibatch %d, obs_clip %g, seed %d",
      absl::StrJoin(hidden, "x"), gamma, lambda, clip, lr, entropy, value_coef, max_grad_norm,
      epochs, minibatch, obs_clip, seed);
}

absl::StatusOr<std::unique_ptr<PpoAgent>> PpoAgent::Create(uint32_t inputs, uint32_t actions,
                                                           const PpoOptions& o) {
  if (inputs == 0 || actions < 2) {
    return absl::InvalidArgumentError("ppo: at least 1 input and 2 actions");
  }
  if (o.hidden.empty() || std::find(o.hidden.begin(), o.hidden.end(), 0u) != o.hidden.end()) {
    return absl::InvalidArgumentError("ppo: hidden: at least one layer, each of positive width");
  }
  auto in = [](double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; };
  if (!in(o.gamma, 0, 1) || !in(o.lambda, 0, 1)) {
    return absl::InvalidArgumentError("ppo: gamma and lambda must be in [0, 1]");
  }
  if (!in(o.clip, 1e-3, 1) || !in(o.lr, 1e-8, 1) || !in(o.entropy, 0, 1) ||
      !in(o.value_coef, 0, 100) || !in(o.max_grad_norm, 1e-6, 1e6) || !in(o.obs_clip, 1e-3, 1e3)) {
    return absl::InvalidArgumentError(
        "ppo: clip in [0.001, 1], lr in [1e-8, 1], entropy in [0, 1], value_coef in [0, 100], "
        "max_grad_norm positive, obs_clip in [0.001, 1000]");
  }
  if (o.epochs < 1 || o.minibatch < 1) {
    return absl::InvalidArgumentError("ppo: epochs and minibatch must be positive");
  }
  Rng init(DeriveSeed(o.seed, "ppo-init"));
  return std::unique_ptr<PpoAgent>(new PpoAgent(inputs, actions, o, init));
}

PpoAgent::PpoAgent(uint32_t inputs, uint32_t actions, const PpoOptions& options, Rng& init)
    : o_(options),
      rng_(DeriveSeed(options.seed, "ppo-shuffle")),
      actor_(Sizes(inputs, options.hidden, actions), 0.01, init),
      critic_(Sizes(inputs, options.hidden, 1), 1.0, init),
      actor_adam_(actor_.size(), options.lr),
      critic_adam_(critic_.size(), options.lr),
      mean_(inputs, 0),
      m2_(inputs, 0),
      frozen_mean_(inputs, 0),
      frozen_std_(inputs, 1) {}

std::vector<double> PpoAgent::Normalise(std::span<const double> raw) const {
  std::vector<double> x(inputs());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::clamp((raw[i] - frozen_mean_[i]) / frozen_std_[i], -o_.obs_clip, o_.obs_clip);
  }
  return x;
}

std::vector<double> PpoAgent::Probabilities(std::span<const double> obs) const {
  std::vector<double> p(actions());
  actor_.Forward(obs, p, nullptr);
  Softmax(p);
  return p;
}

double PpoAgent::Value(std::span<const double> obs) const {
  double v = 0;
  critic_.Forward(obs, {&v, 1}, nullptr);
  return v;
}

PpoAgent::Choice PpoAgent::Sample(std::span<const double> obs, Rng& rng) const {
  const std::vector<double> p = Probabilities(obs);
  const double u = static_cast<double>(rng() >> 11) / static_cast<double>(uint64_t{1} << 53);
  int a = 0;
  for (double c = p[0]; a + 1 < static_cast<int>(p.size()) && u >= c; c += p[++a]) {
  }
  return {.action = a, .logp = std::log(std::max(p[a], 1e-300)), .value = Value(obs)};
}

absl::StatusOr<PpoUpdateStats> PpoAgent::Update(const std::vector<PpoEpisode>& episodes) {
  // Flatten, with GAE advantages and returns per episode.
  std::vector<const PpoStep*> steps;
  std::vector<double> adv, ret;
  PpoUpdateStats stats;
  for (const PpoEpisode& e : episodes) {
    const size_t n = e.steps.size();
    if (n == 0) continue;
    std::vector<double> a(n);
    double next_value = e.bootstrap, next_adv = 0;
    for (size_t t = n; t-- > 0;) {
      const PpoStep& s = e.steps[t];
      if (s.obs.size() != inputs() || s.raw.size() != inputs() || s.action < 0 ||
          s.action >= static_cast<int>(actions())) {
        return absl::InvalidArgumentError(
            absl::StrCat("ppo: a step has ", s.obs.size(), " inputs and action ", s.action,
                         "; the agent takes ", inputs(), " inputs and ", actions(), " actions"));
      }
      const double delta = s.reward + o_.gamma * next_value - s.value;
      a[t] = next_adv = delta + o_.gamma * o_.lambda * next_adv;
      next_value = s.value;
    }
    for (size_t t = 0; t < n; ++t) {
      steps.push_back(&e.steps[t]);
      adv.push_back(a[t]);
      ret.push_back(a[t] + e.steps[t].value);
      stats.mean_reward += e.steps[t].reward;
    }
  }
  const size_t n = steps.size();
  if (n == 0) return absl::InvalidArgumentError("ppo: no steps to learn from");
  stats.steps = n;
  stats.mean_reward /= static_cast<double>(n);
  {
    const double mean = std::accumulate(adv.begin(), adv.end(), 0.0) / static_cast<double>(n);
    double var = 0;
    for (double v : adv) var += (v - mean) * (v - mean);
    const double sd = std::sqrt(var / static_cast<double>(n)) + 1e-8;
    for (double& v : adv) v = (v - mean) / sd;
    double ret_mean = 0, ret_var = 0, res_var = 0;
    for (size_t i = 0; i < n; ++i) ret_mean += ret[i] / static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) {
      ret_var += (ret[i] - ret_mean) * (ret[i] - ret_mean);
      const double r = ret[i] - steps[i]->value;
      res_var += r * r;
    }
    stats.explained_var = ret_var > 0 ? 1 - res_var / ret_var : 0;
  }

  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> actor_grad(actor_.size()), critic_grad(critic_.size());
  std::vector<double> logits(actions()), dlogits(actions());
  TrainNet::Cache actor_cache, critic_cache;
  for (int epoch = 0; epoch < o_.epochs; ++epoch) {
    // Fisher-Yates with the agent's own stream (std::shuffle's use of the engine is the
    // library's; this is the same everywhere).
    for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng_() % i]);
    const bool last_epoch = epoch + 1 == o_.epochs;
    double kl = 0, clipped = 0, policy_loss = 0, value_loss = 0, entropy = 0;
    for (size_t begin = 0; begin < n; begin += o_.minibatch) {
      const size_t end = std::min(n, begin + o_.minibatch);
      const double scale = 1.0 / static_cast<double>(end - begin);
      std::fill(actor_grad.begin(), actor_grad.end(), 0);
      std::fill(critic_grad.begin(), critic_grad.end(), 0);
      for (size_t k = begin; k < end; ++k) {
        const size_t i = order[k];
        const PpoStep& s = *steps[i];
        // Actor: clipped surrogate and entropy bonus, by the logits.
        actor_.Forward(s.obs, logits, &actor_cache);
        std::vector<double>& p = logits;
        Softmax(p);
        const double logp = std::log(std::max(p[s.action], 1e-300));
        const double ratio = std::exp(logp - s.logp);
        const double A = adv[i];
        const bool clip_active = (A >= 0 && ratio > 1 + o_.clip) || (A < 0 && ratio < 1 - o_.clip);
        double h = 0;
        for (double q : p) h -= q > 0 ? q * std::log(q) : 0;
        const double dlogp = clip_active ? 0 : -A * ratio;  // ∂(−min(...)) ÷ ∂logπ(a)
        for (size_t j = 0; j < p.size(); ++j) {
          const double logq = std::log(std::max(p[j], 1e-300));
          dlogits[j] = dlogp * ((static_cast<int>(j) == s.action ? 1 : 0) - p[j]) +
                       o_.entropy * p[j] * (logq + h);  // ∂(−c·H) ÷ ∂logit_j
          dlogits[j] *= scale;
        }
        actor_.Backward(actor_cache, dlogits, actor_grad);
        // Critic: squared error to the return.
        double v = 0;
        critic_.Forward(s.obs, {&v, 1}, &critic_cache);
        const double dv = scale * o_.value_coef * 2 * (v - ret[i]);
        critic_.Backward(critic_cache, {&dv, 1}, critic_grad);
        if (last_epoch) {
          kl += s.logp - logp;
          clipped += std::abs(ratio - 1) > o_.clip ? 1 : 0;
          policy_loss += -std::min(ratio * A, std::clamp(ratio, 1 - o_.clip, 1 + o_.clip) * A);
          value_loss += (v - ret[i]) * (v - ret[i]);
          entropy += h;
        }
      }
      ClipGradNorm(actor_grad, o_.max_grad_norm);
      ClipGradNorm(critic_grad, o_.max_grad_norm);
      actor_adam_.Step(actor_.params(), actor_grad);
      critic_adam_.Step(critic_.params(), critic_grad);
    }
    if (last_epoch) {
      const double m = static_cast<double>(n);
      stats.approx_kl = kl / m;
      stats.clip_fraction = clipped / m;
      stats.policy_loss = policy_loss / m;
      stats.value_loss = value_loss / m;
      stats.entropy = entropy / m;
    }
  }

  // The observation statistics absorb this batch (used from the next collection on).
  const double nb = static_cast<double>(n);
  for (size_t f = 0; f < inputs(); ++f) {
    double bm = 0, bv = 0;
    for (const PpoStep* s : steps) bm += s->raw[f] / nb;
    for (const PpoStep* s : steps) bv += (s->raw[f] - bm) * (s->raw[f] - bm);
    const double total = count_ + nb, d = bm - mean_[f];
    mean_[f] += d * nb / total;
    m2_[f] += bv + d * d * count_ * nb / total;
  }
  count_ += nb;
  for (size_t f = 0; f < inputs(); ++f) {
    frozen_mean_[f] = mean_[f];
    frozen_std_[f] = std::max(kMinStd, std::sqrt(m2_[f] / count_));
  }
  return stats;
}

Normaliser PpoAgent::CurrentNormaliser() const {
  Normaliser n{.clip = static_cast<float>(o_.obs_clip)};
  for (size_t f = 0; f < inputs(); ++f) {
    n.mean.push_back(static_cast<float>(frozen_mean_[f]));
    n.std.push_back(static_cast<float>(frozen_std_[f]));
  }
  return n;
}

absl::StatusOr<Mlp> PpoAgent::ExportActor() const { return actor_.ToMlp(CurrentNormaliser()); }

namespace {

class Explorer final : public Controller {
 public:
  Explorer(const PpoAgent& agent, uint64_t seed, PpoEpisode* out, const Bounds& bounds)
      : agent_(agent), rng_(seed), out_(out), bounds_(bounds) {}
  std::string name() const override { return "ppo-explorer"; }

  Decision Decide(std::span<const WindowState> history) override {
    const WindowState& now = history.back();
    if (have_pending_) {
      pending_.reward = Reward(now);
      pending_.window = now.index;
      out_->steps.push_back(std::move(pending_));
    }
    const std::array<double, kNumFeatures> f = Features(now);
    pending_ = PpoStep{.raw = {f.begin(), f.end()}};
    pending_.obs = agent_.Normalise(pending_.raw);
    const PpoAgent::Choice c = agent_.Sample(pending_.obs, rng_);
    pending_.action = c.action;
    pending_.logp = c.logp;
    pending_.value = c.value;
    have_pending_ = true;
    out_->bootstrap = c.value;
    const double alpha = bounds_.Clip(now.alpha + kActions[c.action]);
    return {.alpha = alpha, .reason = Reason::kPolicy, .detail = "exploring"};
  }

 private:
  const PpoAgent& agent_;
  Rng rng_;
  PpoEpisode* out_;
  const Bounds bounds_;
  PpoStep pending_;
  bool have_pending_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Controller>> MakeExplorer(const PpoAgent& agent, uint64_t seed,
                                                         PpoEpisode* out, const Bounds& bounds) {
  if (agent.inputs() != kNumFeatures || agent.actions() != kActions.size() || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "explorer: the agent takes ", agent.inputs(), " inputs and ", agent.actions(),
        " actions; the allocator's policy takes ", kNumFeatures, " and ", kActions.size()));
  }
  return std::unique_ptr<Controller>(std::make_unique<Explorer>(agent, seed, out, bounds));
}

}  // namespace hlem::allocator
