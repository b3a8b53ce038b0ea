#pragma once
// Zipf-distributed integers in [0, n): P(k) proportional to 1 / (k + 1)^exponent, exponent >= 0.
// Rejection-inversion sampling (Hörmann & Derflinger 1996): O(1) memory and time per draw for any
// n, so a billion-row table needs no CDF array. Exponent 0 is uniform.
// Not thread-safe (holds no state but is meant to be used with a per-thread Rng).

#include <cmath>
#include <cstdint>
#include <random>

namespace hlem {

class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double exponent) : n_(n), s_(exponent) {
    h_x1_ = HIntegral(1.5) - 1.0;
    h_n_ = HIntegral(static_cast<double>(n_) + 0.5);
    shift_ = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
  }

  uint64_t n() const { return n_; }
  double exponent() const { return s_; }

  template <typename Rng>
  uint64_t operator()(Rng& rng) const {
    if (n_ <= 1) return 0;
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    while (true) {
      double u = h_n_ + unit(rng) * (h_x1_ - h_n_);
      double x = HIntegralInverse(u);
      double kd = std::floor(x + 0.5);
      if (kd < 1) kd = 1;
      if (kd > static_cast<double>(n_)) kd = static_cast<double>(n_);
      if (kd - x <= shift_ || u >= HIntegral(kd + 0.5) - H(kd)) {
        return static_cast<uint64_t>(kd) - 1;
      }
    }
  }

 private:
  // (exp(x) - 1) / x and log1p(x) / x, accurate near 0.
  static double Expm1OverX(double x) { return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1 + x / 2; }
  static double Log1pOverX(double x) { return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1 - x / 2; }
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  double HIntegral(double x) const {
    double lx = std::log(x);
    return Expm1OverX((1.0 - s_) * lx) * lx;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;  // guards rounding at the domain edge
    return std::exp(Log1pOverX(t) * x);
  }

  uint64_t n_;
  double s_;
  double h_x1_, h_n_, shift_;
};

}  // namespace hlem
