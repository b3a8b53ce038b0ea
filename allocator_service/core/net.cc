#include "allocator_service/core/net.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

namespace hlem::allocator {

double Gaussian(Rng& rng) {
  auto uniform = [&rng] {  // (0, 1]
    return (static_cast<double>(rng() >> 11) + 1) / static_cast<double>(uint64_t{1} << 53);
  };
  const double u = uniform(), v = uniform();
  return std::sqrt(-2 * std::log(u)) * std::cos(2 * std::numbers::pi * v);
}

TrainNet::TrainNet(std::vector<uint32_t> sizes, double out_gain, Rng& rng)
    : sizes_(std::move(sizes)) {
  size_t n = 0;
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
    offset_.push_back(n);
    n += static_cast<size_t>(sizes_[l] + 1) * sizes_[l + 1];
  }
  params_.assign(n, 0);
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
    const double scale = (l + 2 == sizes_.size() ? out_gain : 1.0) / std::sqrt(sizes_[l]);
    double* w = params_.data() + offset_[l];
    for (size_t i = 0; i < static_cast<size_t>(sizes_[l]) * sizes_[l + 1]; ++i) {
      w[i] = scale * Gaussian(rng);
    }
  }
}

void TrainNet::Forward(std::span<const double> x, std::span<double> y, Cache* cache) const {
  const size_t layers = sizes_.size() - 1;
  std::vector<double> a(x.begin(), x.end()), b;
  if (cache != nullptr) cache->a.resize(layers);
  for (size_t l = 0; l < layers; ++l) {
    const uint32_t in = sizes_[l], out = sizes_[l + 1];
    const double* w = W(l);
    b.assign(B(l), B(l) + out);
    for (uint32_t o = 0; o < out; ++o) {
      double s = 0;
      for (uint32_t i = 0; i < in; ++i) s += w[static_cast<size_t>(o) * in + i] * a[i];
      b[o] += s;
      if (l + 1 < layers) b[o] = std::tanh(b[o]);
    }
    if (cache != nullptr) cache->a[l] = std::move(a);
    a = std::move(b);
  }
  std::copy_n(a.begin(), outputs(), y.begin());
}

void TrainNet::Backward(const Cache& cache, std::span<const double> dy,
                        std::span<double> grad) const {
  std::vector<double> delta(dy.begin(), dy.end()), prev;
  for (size_t l = sizes_.size() - 1; l-- > 0;) {
    const uint32_t in = sizes_[l], out = sizes_[l + 1];
    const std::vector<double>& a = cache.a[l];
    const double* w = W(l);
    double* gw = grad.data() + offset_[l];
    double* gb = gw + static_cast<size_t>(in) * out;
    for (uint32_t o = 0; o < out; ++o) {
      gb[o] += delta[o];
      for (uint32_t i = 0; i < in; ++i) gw[static_cast<size_t>(o) * in + i] += delta[o] * a[i];
    }
    if (l == 0) break;
    prev.assign(in, 0);
    for (uint32_t o = 0; o < out; ++o) {
      for (uint32_t i = 0; i < in; ++i) prev[i] += w[static_cast<size_t>(o) * in + i] * delta[o];
    }
    for (uint32_t i = 0; i < in; ++i) prev[i] *= 1 - a[i] * a[i];  // a = tanh(z)
    std::swap(delta, prev);
  }
}

absl::StatusOr<Mlp> TrainNet::ToMlp(Normaliser normaliser) const {
  std::vector<DenseLayer> layers;
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
    const uint32_t in = sizes_[l], out = sizes_[l + 1];
    DenseLayer d{.in = in, .out = out};
    d.weights.assign(W(l), W(l) + static_cast<size_t>(in) * out);
    d.bias.assign(B(l), B(l) + out);
    layers.push_back(std::move(d));
  }
  return Mlp::Create(std::move(normaliser), std::move(layers), Activation::kTanh);
}

Adam::Adam(size_t n, double lr, double beta1, double beta2, double eps)
    : lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps), m_(n, 0), v_(n, 0) {}

void Adam::Step(std::span<double> params, std::span<const double> grad) {
  p1_ *= beta1_;
  p2_ *= beta2_;
  const double c1 = 1 - p1_, c2 = 1 - p2_;
  for (size_t i = 0; i < params.size(); ++i) {
    m_[i] = beta1_ * m_[i] + (1 - beta1_) * grad[i];
    v_[i] = beta2_ * v_[i] + (1 - beta2_) * grad[i] * grad[i];
    params[i] -= lr_ * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + eps_);
  }
}

double ClipGradNorm(std::span<double> grad, double max_norm) {
  double sq = 0;
  for (double g : grad) sq += g * g;
  const double norm = std::sqrt(sq);
  if (norm > max_norm && norm > 0) {
    const double k = max_norm / norm;
    for (double& g : grad) g *= k;
  }
  return norm;
}

}  // namespace hlem::allocator
