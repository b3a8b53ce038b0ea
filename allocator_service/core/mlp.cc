#include "allocator_service/core/mlp.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace hlem::allocator {
namespace {

// Reads whitespace-separated tokens and remembers the line each came from.
class Tokens {
 public:
  explicit Tokens(const std::string& text) {
    std::istringstream in(text);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      line = line.substr(0, line.find('#'));  // a comment runs to the end of its line
      std::istringstream words(line);
      std::string w;
      while (words >> w) tokens_.push_back({std::move(w), n});
    }
  }
  absl::Status Word(const char* expected) {
    if (at_ == tokens_.size() || tokens_[at_].first != expected) {
      return Error(absl::StrCat("expected '", expected, "'"));
    }
    ++at_;
    return absl::OkStatus();
  }
  absl::Status Count(const char* what, uint32_t max, uint32_t* out) {
    uint64_t v = 0;
    if (at_ == tokens_.size() || !absl::SimpleAtoi(tokens_[at_].first, &v) || v == 0 || v > max) {
      return Error(absl::StrCat("expected ", what, " (1..", max, ")"));
    }
    ++at_;
    *out = static_cast<uint32_t>(v);
    return absl::OkStatus();
  }
  absl::Status Floats(const char* what, size_t n, std::vector<float>* out) {
    // The count is the file's word: no more numbers than the file holds tokens are allocated.
    if (const size_t left = tokens_.size() - at_; n > left) {
      at_ = tokens_.size();
      return Error(
          absl::StrCat("expected ", n, " finite numbers for ", what, ", only ", left, " left"));
    }
    out->resize(n);
    for (size_t i = 0; i < n; ++i) {
      float v = 0;
      if (at_ == tokens_.size() || !absl::SimpleAtof(tokens_[at_].first, &v) || !std::isfinite(v)) {
        return Error(absl::StrCat("expected ", n, " finite numbers for ", what, ", got ", i));
      }
      (*out)[i] = v;
      ++at_;
    }
    return absl::OkStatus();
  }
  absl::Status End() {
    return at_ == tokens_.size() ? absl::OkStatus() : Error("unexpected text after the last layer");
  }

 private:
  absl::Status Error(const std::string& what) const {
    const int line =
        at_ < tokens_.size() ? tokens_[at_].second : (tokens_.empty() ? 1 : tokens_.back().second);
    return absl::InvalidArgumentError(absl::StrCat("mlp: line ", line, ": ", what,
                                                   at_ == tokens_.size() ? " (end of file)" : ""));
  }
  std::vector<std::pair<std::string, int>> tokens_;
  size_t at_ = 0;
};

constexpr uint32_t kMaxWidth = 1 << 16;
constexpr uint32_t kMaxLayers = 64;

}  // namespace

absl::StatusOr<Mlp> Mlp::Create(Normaliser normaliser, std::vector<DenseLayer> layers,
                                Activation activation) {
  if (layers.empty()) return absl::InvalidArgumentError("mlp: no layers");
  for (size_t l = 0; l < layers.size(); ++l) {
    const DenseLayer& d = layers[l];
    if (d.in == 0 || d.out == 0 || (l > 0 && d.in != layers[l - 1].out)) {
      return absl::InvalidArgumentError(absl::StrCat("mlp: layer ", l, " is ", d.in, " -> ", d.out,
                                                     "; sizes must be positive and chain"));
    }
    if (d.weights.size() != static_cast<size_t>(d.in) * d.out || d.bias.size() != d.out) {
      return absl::InvalidArgumentError(absl::StrCat("mlp: layer ", l, " needs ", d.in * d.out,
                                                     " weights and ", d.out, " biases"));
    }
    for (const std::vector<float>* v : {&d.weights, &d.bias}) {
      if (!std::all_of(v->begin(), v->end(), [](float x) { return std::isfinite(x); })) {
        return absl::InvalidArgumentError(absl::StrCat("mlp: layer ", l, ": non-finite value"));
      }
    }
  }
  const size_t n = layers.front().in;
  if (normaliser.mean.size() != n || normaliser.std.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("mlp: the normaliser has ", normaliser.mean.size(), " means and ",
                     normaliser.std.size(), " deviations for ", n, " inputs"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(normaliser.mean[i]) || !(normaliser.std[i] > 0) ||
        !std::isfinite(normaliser.std[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("mlp: normaliser input ", i, ": mean finite and std > 0 needed"));
    }
  }
  if (!(normaliser.clip > 0) || !std::isfinite(normaliser.clip)) {
    return absl::InvalidArgumentError("mlp: normaliser clip must be positive");
  }
  Mlp m;
  uint32_t widest = 0;
  for (const DenseLayer& d : layers) widest = std::max({widest, d.in, d.out});
  m.normaliser_ = std::move(normaliser);
  m.layers_ = std::move(layers);
  for (const DenseLayer& d : m.layers_) {
    std::vector<float> t(d.weights.size());
    for (uint32_t o = 0; o < d.out; ++o) {
      for (uint32_t i = 0; i < d.in; ++i) {
        t[static_cast<size_t>(i) * d.out + o] = d.weights[static_cast<size_t>(o) * d.in + i];
      }
    }
    m.transposed_.push_back(std::move(t));
  }
  m.activation_ = activation;
  m.a_.resize(widest);
  m.b_.resize(widest);
  return m;
}

absl::StatusOr<Mlp> Mlp::Parse(const std::string& text) {
  Tokens t(text);
  RETURN_IF_ERROR(t.Word("hlem-mlp"));
  RETURN_IF_ERROR(t.Word("1"));
  RETURN_IF_ERROR(t.Word("activation"));
  Activation activation;
  if (t.Word("tanh").ok()) {
    activation = Activation::kTanh;
  } else {
    RETURN_IF_ERROR(t.Word("relu"));
    activation = Activation::kRelu;
  }
  Normaliser norm;
  uint32_t n = 0;
  RETURN_IF_ERROR(t.Word("normaliser"));
  RETURN_IF_ERROR(t.Count("the input size", kMaxWidth, &n));
  RETURN_IF_ERROR(t.Floats("the means", n, &norm.mean));
  RETURN_IF_ERROR(t.Floats("the deviations", n, &norm.std));
  RETURN_IF_ERROR(t.Word("clip"));
  std::vector<float> clip;
  RETURN_IF_ERROR(t.Floats("clip", 1, &clip));
  norm.clip = clip[0];
  uint32_t k = 0;
  RETURN_IF_ERROR(t.Word("layers"));
  RETURN_IF_ERROR(t.Count("the layer count", kMaxLayers, &k));
  std::vector<DenseLayer> layers(k);
  for (DenseLayer& d : layers) {
    RETURN_IF_ERROR(t.Word("layer"));
    RETURN_IF_ERROR(t.Count("the layer's inputs", kMaxWidth, &d.in));
    RETURN_IF_ERROR(t.Count("the layer's outputs", kMaxWidth, &d.out));
    RETURN_IF_ERROR(t.Floats("the weights", static_cast<size_t>(d.in) * d.out, &d.weights));
    RETURN_IF_ERROR(t.Floats("the biases", d.out, &d.bias));
  }
  RETURN_IF_ERROR(t.End());
  return Create(std::move(norm), std::move(layers), activation);
}

absl::StatusOr<Mlp> Mlp::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("weights file ", path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<Mlp> m = Parse(text.str());
  if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", m.status().message()));
  return m;
}

std::string Mlp::Serialize() const {
  auto row = [](std::string* out, std::span<const float> v) {
    for (size_t i = 0; i < v.size(); ++i) absl::StrAppendFormat(out, "%s%.9g", i ? " " : "", v[i]);
    out->push_back('\n');
  };
  std::string s =
      absl::StrCat("hlem-mlp 1\nactivation ", activation_ == Activation::kTanh ? "tanh" : "relu",
                   "\nnormaliser ", normaliser_.mean.size(), "\n");
  row(&s, normaliser_.mean);
  row(&s, normaliser_.std);
  absl::StrAppendFormat(&s, "clip %.9g\nlayers %d\n", normaliser_.clip, layers_.size());
  for (const DenseLayer& d : layers_) {
    absl::StrAppendFormat(&s, "layer %d %d\n", d.in, d.out);
    for (uint32_t o = 0; o < d.out; ++o) {
      row(&s, std::span<const float>(d.weights).subspan(static_cast<size_t>(o) * d.in, d.in));
    }
    row(&s, d.bias);
  }
  return s;
}

size_t Mlp::parameters() const {
  size_t n = 0;
  for (const DenseLayer& d : layers_) n += d.weights.size() + d.bias.size();
  return n;
}

void Mlp::Forward(std::span<const float> x, std::span<float> y) const {
  const Normaliser& nm = normaliser_;
  for (uint32_t i = 0; i < inputs(); ++i) {
    a_[i] = std::clamp((x[i] - nm.mean[i]) / nm.std[i], -nm.clip, nm.clip);
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DenseLayer& d = layers_[l];
    const bool last = l + 1 == layers_.size();
    // b = bias + Σ_i a[i] · W[:, i], a column at a time (no reduction chain: vectorises).
    float* b = b_.data();
    std::copy(d.bias.begin(), d.bias.end(), b);
    for (uint32_t i = 0; i < d.in; ++i) {
      const float a = a_[i];
      const float* w = transposed_[l].data() + static_cast<size_t>(i) * d.out;
      for (uint32_t o = 0; o < d.out; ++o) b[o] += w[o] * a;
    }
    if (!last) {
      for (uint32_t o = 0; o < d.out; ++o) {
        b[o] = activation_ == Activation::kTanh ? std::tanh(b[o]) : std::max(b[o], 0.0f);
      }
    }
    std::swap(a_, b_);
  }
  std::copy_n(a_.begin(), outputs(), y.begin());
}

}  // namespace hlem::allocator
