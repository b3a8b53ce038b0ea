#include "allocator_service/core/mlp.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "allocator_service/core/mlp_testing.h"
#include "gtest/gtest.h"

namespace hlem::allocator {
namespace {

// 2 inputs -> 2 tanh units -> 1 linear output, with a normaliser.
Mlp Small() {
  Normaliser n{.mean = {1, -1}, .std = {2, 0.5}, .clip = 3};
  std::vector<DenseLayer> layers = {
      {.in = 2, .out = 2, .weights = {0.5f, -1, 2, 0.25f}, .bias = {0.1f, -0.2f}},
      {.in = 2, .out = 1, .weights = {1.5f, -0.75f}, .bias = {0.05f}}};
  auto m = Mlp::Create(n, layers, Activation::kTanh);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

TEST(MlpTest, ForwardIsTheNetworkOnNormalisedClippedInputs) {
  const Mlp m = Small();
  const std::vector<float> x = {3, 10};  // normalised: 1 and 22 -> clipped to 3
  const double z0 = 1, z1 = 3;
  const double h0 = std::tanh(0.5 * z0 - 1 * z1 + 0.1), h1 = std::tanh(2 * z0 + 0.25 * z1 - 0.2);
  const double want = 1.5 * h0 - 0.75 * h1 + 0.05;
  float y = 0;
  m.Forward(x, std::span<float>(&y, 1));
  EXPECT_NEAR(y, want, 1e-6);
  EXPECT_EQ(m.parameters(), 9u);
}

TEST(MlpTest, SerializeParseRoundTripsExactly) {
  // An actor of the size issue 7 allows (7 -> 64 -> 64 -> 7, ReLU), random weights.
  const std::vector<DenseLayer> layers =
      testing::RandomLayers({{7, 64}, {64, 64}, {64, 7}}, 3, 0.3f);
  std::mt19937 rng(3);
  Normaliser n{.mean = std::vector<float>(7, 0.4f), .std = std::vector<float>(7, 0.2f)};
  auto m = Mlp::Create(n, layers, Activation::kRelu);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->parameters(), 5127u);  // < 25 K
  const std::string text = m->Serialize();
  auto back = Mlp::Parse(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Serialize(), text);
  // Comments (what training records) are skipped wherever they start.
  auto commented = Mlp::Parse("# hlem train-ppo --seed 1\n" + text.substr(0, text.find('\n')) +
                              "  # version\n" + text.substr(text.find('\n') + 1));
  ASSERT_TRUE(commented.ok()) << commented.status();
  EXPECT_EQ(commented->Serialize(), text);
  std::uniform_real_distribution<float> u(0, 1);
  for (int t = 0; t < 20; ++t) {
    std::vector<float> x(7), y1(7), y2(7);
    for (float& v : x) v = u(rng);
    m->Forward(x, y1);
    back->Forward(x, y2);
    EXPECT_EQ(y1, y2);
  }
}

TEST(MlpTest, BadFilesAndShapesGetClearErrors) {
  const std::string good = Small().Serialize();
  EXPECT_TRUE(Mlp::Parse(good).ok());
  auto expect_error = [](const std::string& text, const std::string& needle) {
    auto m = Mlp::Parse(text);
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status();
  };
  expect_error("hlem-mlp 2\n", "line 1: expected '1'");
  expect_error("not a policy", "expected 'hlem-mlp'");
  // Truncated: the last line (the output layer's bias) missing.
  expect_error(good.substr(0, good.rfind('\n', good.size() - 2) + 1), "end of file");
  expect_error(good + "7\n", "unexpected text");
  std::string nan = good;
  nan.replace(nan.find("0.5"), 3, "nan");
  expect_error(nan, "finite");
  std::string zero_std = good;
  zero_std.replace(zero_std.find("2 0.5"), 5, "2 0");
  expect_error(zero_std, "std > 0");
  // Sizes that do not chain: the second layer takes 3 inputs from a 2-unit layer.
  expect_error(
      "hlem-mlp 1\nactivation tanh\nnormaliser 1\n0\n1\nclip 5\nlayers 2\nlayer 1 2\n1\n1\n0 0\n"
      "layer 3 1\n1 1 1\n0\n",
      "chain");
  // A layer declared at the widest allowed (2^32 weights) in a few bytes is refused on its word
  // alone: nothing is allocated for numbers the file does not hold.
  expect_error(
      "hlem-mlp 1\nactivation relu\nnormaliser 1\n0\n1\nclip 1\nlayers 1\nlayer 65536 65536\n",
      "expected 4294967296 finite numbers for the weights");
  EXPECT_EQ(Mlp::Load("/nonexistent/policy.mlp").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace hlem::allocator
