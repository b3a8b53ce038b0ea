#pragma once
// Tests and benchmarks only: dense layers of given sizes with seeded random weights.

#include <cstdint>
#include <initializer_list>
#include <random>
#include <utility>
#include <vector>

#include "allocator_service/core/mlp.h"

namespace hlem::allocator::testing {

// Layers of the given (in, out) sizes, weights and biases drawn from N(0, stddev²).
inline std::vector<DenseLayer> RandomLayers(
    std::initializer_list<std::pair<uint32_t, uint32_t>> sizes, uint64_t seed, float stddev) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> g(0, stddev);
  std::vector<DenseLayer> layers;
  for (auto [in, out] : sizes) {
    DenseLayer d{.in = in, .out = out};
    for (uint32_t i = 0; i < in * out; ++i) d.weights.push_back(g(rng));
    for (uint32_t i = 0; i < out; ++i) d.bias.push_back(g(rng));
    layers.push_back(std::move(d));
  }
  return layers;
}

}  // namespace hlem::allocator::testing
