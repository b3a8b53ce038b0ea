#pragma once
// A small dense network for the learned controllers (ARCHITECTURE §3: the PPO actor runs in the
// allocator as a plain C++ MLP, frozen; no framework dispatch) and the observation normaliser
// trained with it, in one versioned text file that training writes and the allocator reads:
//
//   hlem-mlp 1
//   activation tanh                 hidden layers' activation: tanh | relu (the last is linear)
//   normaliser <n>                  the input size; then n means, n standard deviations, a clip
//   <mean_0> ... <mean_n-1>
//   <std_0> ... <std_n-1>
//   clip <c>                        normalised inputs are clamped to [-c, c]
//   layers <k>
//   layer <in> <out>                k times: out rows of in weights, then one row of out biases
//   <w_0,0> ... <w_0,in-1>
//   ...
//   <b_0> ... <b_out-1>
//
// Numbers are decimal floats; whitespace and line breaks between them are free; '#' starts a
// comment that runs to the end of its line (training records its command and options there). Every
// error names what was expected and where (line). Forward() allocates nothing (its scratch is the
// object's: one thread at a time per instance).

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hlem::allocator {

struct DenseLayer {
  uint32_t in = 0, out = 0;
  std::vector<float> weights;  // out × in, row-major: weights[o * in + i]
  std::vector<float> bias;     // out
};

enum class Activation : uint8_t { kTanh, kRelu };

struct Normaliser {
  std::vector<float> mean, std;  // per input; std > 0
  float clip = 5;
};

class Mlp {
 public:
  // INVALID_ARGUMENT for no layers, sizes that do not chain, weight or bias vectors of the wrong
  // length, a normaliser of another size than the first layer's input, a std ≤ 0 or a clip ≤ 0,
  // or a non-finite number.
  static absl::StatusOr<Mlp> Create(Normaliser normaliser, std::vector<DenseLayer> layers,
                                    Activation activation);
  // The text format above.
  static absl::StatusOr<Mlp> Parse(const std::string& text);
  // NOT_FOUND for a missing file, otherwise as Parse (the message names the file).
  static absl::StatusOr<Mlp> Load(const std::string& path);
  std::string Serialize() const;

  uint32_t inputs() const { return layers_.front().in; }
  uint32_t outputs() const { return layers_.back().out; }
  size_t parameters() const;
  // y = net(clip((x − mean) ÷ std)); x has inputs() values, y outputs().
  void Forward(std::span<const float> x, std::span<float> y) const;

 private:
  Mlp() = default;
  Normaliser normaliser_;
  std::vector<DenseLayer> layers_;
  Activation activation_ = Activation::kTanh;
  std::vector<std::vector<float>> transposed_;  // per layer, in × out: the inner loop vectorises
  mutable std::vector<float> a_, b_;            // scratch
};

}  // namespace hlem::allocator
