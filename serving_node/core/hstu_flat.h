#pragma once
// An HSTU model (ARCHITECTURE §5) as flat fp32 arrays, a plain C++ forward over them, and the
// binary "HSTU fixture" file: the weights, requests and the libtorch runner's scores for them.
// The CUDA runner (serving_node/device/cuda/hstu_runner.h) uploads HstuFlatWeights; a fixture
// written here by the libtorch runner (hlem_hstu_fixture) carries the oracle's scores to a bare
// GPU host, where hlem_cuda_model checks the CUDA runner against them. Standard library only (it
// builds on GPU hosts without Debian's packages).
//
// Layout (row-major, matrices stored for x · W as the libtorch runner holds them):
//   pos [max_positions + 1][D]; per layer ln1_w, ln1_b [D], w_uvqk [D][U], b_uvqk [U],
//   ln2_w, ln2_b [hv], w_o [hv][D]; head_w1 [D][h], head_b1 [h], head_w2 [h][T], head_b2 [T],
// with U = 2·hv + 2·hq, hv = heads·d_v, hq = heads·d_qk (UVQK split in that order).
//
// Fixture file (little-endian): "HLEMHSTF", u32 version (1), u32 layers, dim, heads, d_qk, d_v,
// head_hidden, targets, max_positions, f32 attn_norm, u64 seed; then every weight array above in
// that order as u64 count + count f32; then u32 cases and per case u32 history, u32 candidates,
// history × D f32, candidates × D f32, candidates × T f32 (the scores).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace hlem::serving {

struct HstuFlatShape {
  uint32_t layers = 0, dim = 0, heads = 0, d_qk = 0, d_v = 0, head_hidden = 0, targets = 0;
  uint32_t max_positions = 0;
  float attn_norm = 1;

  uint64_t hq() const { return uint64_t{heads} * d_qk; }
  uint64_t hv() const { return uint64_t{heads} * d_v; }
  uint64_t uvqk() const { return 2 * hv() + 2 * hq(); }
  uint32_t kv_dim() const { return heads * std::max(d_qk, d_v); }

  // "" when the shape is one a fixture may describe; else why not, naming the field. The bounds
  // keep a hostile file from asking for more memory than a real model needs.
  std::string Error() const {
    const struct {
      const char* name;
      uint32_t value, max;
    } fields[] = {{"layers", layers, 64},     {"dim", dim, 16384},
                  {"heads", heads, 256},      {"d_qk", d_qk, 1024},
                  {"d_v", d_v, 1024},         {"head_hidden", head_hidden, 65536},
                  {"targets", targets, 4096}, {"max_positions", max_positions, 1u << 20}};
    for (const auto& f : fields) {
      if (f.value == 0 || f.value > f.max) {
        return std::string(f.name) + " must be in [1, " + std::to_string(f.max) + "], not " +
               std::to_string(f.value);
      }
    }
    if (!(attn_norm > 0) || !std::isfinite(attn_norm)) return "attn_norm must be positive";
    if (hq() > 65536 || hv() > 65536) return "heads × d_qk and heads × d_v must be at most 65536";
    return "";
  }
};

struct HstuFlatLayer {
  std::vector<float> ln1_w, ln1_b, w_uvqk, b_uvqk, ln2_w, ln2_b, w_o;
};

struct HstuFlatWeights {
  HstuFlatShape shape;
  std::vector<float> pos;
  std::vector<HstuFlatLayer> layers;
  std::vector<float> head_w1, head_b1, head_w2, head_b2;

  // Calls fn(name, array, expected element count) for every array, in file order.
  template <typename Self, typename Fn>
  static void ForEachArray(Self& w, Fn&& fn) {
    const HstuFlatShape& s = w.shape;
    const uint64_t D = s.dim, h = s.head_hidden, T = s.targets;
    fn("pos", w.pos, (uint64_t{s.max_positions} + 1) * D);
    for (size_t l = 0; l < w.layers.size(); ++l) {
      auto& L = w.layers[l];
      const std::string p = "layers." + std::to_string(l) + ".";
      fn(p + "ln1_w", L.ln1_w, D);
      fn(p + "ln1_b", L.ln1_b, D);
      fn(p + "w_uvqk", L.w_uvqk, D * s.uvqk());
      fn(p + "b_uvqk", L.b_uvqk, s.uvqk());
      fn(p + "ln2_w", L.ln2_w, s.hv());
      fn(p + "ln2_b", L.ln2_b, s.hv());
      fn(p + "w_o", L.w_o, s.hv() * D);
    }
    fn("head_w1", w.head_w1, D * h);
    fn("head_b1", w.head_b1, h);
    fn("head_w2", w.head_w2, h * T);
    fn("head_b2", w.head_b2, T);
  }

  // "" when the shape is valid and every array has its size and only finite values.
  std::string Error() const {
    if (std::string e = shape.Error(); !e.empty()) return e;
    if (layers.size() != shape.layers) return "the layer count does not match the shape";
    std::string error;
    ForEachArray(*this, [&](const std::string& name, const std::vector<float>& a, uint64_t n) {
      if (!error.empty()) return;
      if (a.size() != n) {
        error = name + ": " + std::to_string(a.size()) + " values, the shape needs " +
                std::to_string(n);
      } else if (!std::all_of(a.begin(), a.end(), [](float x) { return std::isfinite(x); })) {
        error = name + ": holds a NaN or an infinity";
      }
    });
    return error;
  }
};

// The reference paper's HSTU (ARCHITECTURE §9): D 512, 4 heads of 128, a 256-wide head, one
// target, N = 1024; the GPU tools time it.
inline HstuFlatShape PaperHstuShape(uint32_t layers, uint32_t max_positions) {
  HstuFlatShape s;
  s.layers = layers;
  s.dim = 512;
  s.heads = 4;
  s.d_qk = 128;
  s.d_v = 128;
  s.head_hidden = 256;
  s.targets = 1;
  s.max_positions = max_positions;
  s.attn_norm = 1024;
  return s;
}

// Random weights of `shape` from `seed` (deterministic, standard library only): matrices uniform
// with variance 1/fan_in, LayerNorm gains 1 ± 0.05, biases ± 0.05, positions ± 0.035, as
// HstuModel::CreateRandom draws them (though not the same numbers). For GPU checks and timings.
inline HstuFlatWeights RandomHstuFlatWeights(const HstuFlatShape& shape, uint64_t seed) {
  HstuFlatWeights w;
  w.shape = shape;
  w.layers.resize(shape.layers);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(-1, 1);
  auto fan_in = [&](const std::string& name) -> double {
    if (name.find("w_o") != std::string::npos) return static_cast<double>(shape.hv());
    if (name == "head_w2") return shape.head_hidden;
    return shape.dim;
  };
  HstuFlatWeights::ForEachArray(w, [&](const std::string& name, std::vector<float>& a, uint64_t n) {
    const bool matrix =
        name.find("w_") != std::string::npos || name.find("_w") != std::string::npos;
    const bool gain = name.find("ln") != std::string::npos && name.back() == 'w';
    const float half = name == "pos"     ? 0.035f
                       : gain || !matrix ? 0.05f
                                         : static_cast<float>(std::sqrt(3.0 / fan_in(name)));
    a.resize(n);
    for (float& x : a) x = (gain ? 1.0f : 0.0f) + half * unit(rng);
  });
  return w;
}

// The libtorch runner's ForwardReference (full recompute, no cache) in double sums: history
// H × D and candidates C × D (summed feature rows), scores C × T. The fixture's self-check.
inline void HstuForwardHost(const HstuFlatWeights& w, const float* history, uint32_t H,
                            const float* candidates, uint32_t C, float* scores) {
  const HstuFlatShape& s = w.shape;
  const uint64_t D = s.dim, n = uint64_t{H} + C, U = s.uvqk(), hv = s.hv(), hq = s.hq();
  std::vector<double> x(n * D);
  for (uint64_t t = 0; t < n; ++t) {
    const float* e = t < H ? history + t * D : candidates + (t - H) * D;
    const float* p = w.pos.data() + (t < H ? t : H) * D;
    for (uint64_t d = 0; d < D; ++d) x[t * D + d] = std::sqrt(double(D)) * e[d] + p[d];
  }
  auto layer_norm = [](const double* in, uint64_t width, const float* g, const float* b,
                       double* out) {
    double mean = 0, var = 0;
    for (uint64_t i = 0; i < width; ++i) mean += in[i];
    mean /= double(width);
    for (uint64_t i = 0; i < width; ++i) var += (in[i] - mean) * (in[i] - mean);
    const double inv = 1 / std::sqrt(var / double(width) + 1e-5);
    for (uint64_t i = 0; i < width; ++i) out[i] = (in[i] - mean) * inv * g[i] + b[i];
  };
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  // out[r][c] = Σ_k in[r][k] · W[k][c] (+ bias[c])
  auto matmul = [](const double* in, uint64_t rows, uint64_t k, const float* W, uint64_t cols,
                   const float* bias, double* out) {
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t c = 0; c < cols; ++c) out[r * cols + c] = bias ? bias[c] : 0.0;
      for (uint64_t i = 0; i < k; ++i) {
        const double a = in[r * k + i];
        for (uint64_t c = 0; c < cols; ++c) out[r * cols + c] += a * W[i * cols + c];
      }
    }
  };
  std::vector<double> xn(n * D), uvqk(n * U), a(n * hv), g(n * hv), y(n * D);
  for (const HstuFlatLayer& L : w.layers) {
    for (uint64_t t = 0; t < n; ++t) {
      layer_norm(&x[t * D], D, L.ln1_w.data(), L.ln1_b.data(), &xn[t * D]);
    }
    matmul(xn.data(), n, D, L.w_uvqk.data(), U, L.b_uvqk.data(), uvqk.data());
    for (double& v : uvqk) v = silu(v);
    // Columns of a token's row: U [0, hv), V [hv, 2hv), Q [2hv, 2hv + hq), K [2hv + hq, U).
    auto at = [&](uint64_t t, uint64_t col) { return uvqk[t * U + col]; };
    std::fill(a.begin(), a.end(), 0.0);
    for (uint64_t i = 0; i < n; ++i) {
      for (uint64_t j = 0; j < n; ++j) {
        const bool seen = i < H ? j <= i : (j < H || j == i);
        if (!seen) continue;
        for (uint32_t h = 0; h < s.heads; ++h) {
          double dot = 0;
          for (uint32_t e = 0; e < s.d_qk; ++e) {
            dot += at(i, 2 * hv + h * s.d_qk + e) * at(j, 2 * hv + hq + h * s.d_qk + e);
          }
          const double wgt = silu(dot / std::sqrt(double(s.d_qk))) / s.attn_norm;
          for (uint32_t e = 0; e < s.d_v; ++e)
            a[i * hv + h * s.d_v + e] += wgt * at(j, hv + h * s.d_v + e);
        }
      }
    }
    for (uint64_t t = 0; t < n; ++t) {
      layer_norm(&a[t * hv], hv, L.ln2_w.data(), L.ln2_b.data(), &g[t * hv]);
      for (uint64_t e = 0; e < hv; ++e) g[t * hv + e] *= at(t, e);
    }
    matmul(g.data(), n, hv, L.w_o.data(), D, nullptr, y.data());
    for (uint64_t i = 0; i < n * D; ++i) x[i] += y[i];
  }
  const uint64_t h = s.head_hidden, T = s.targets;
  std::vector<double> hidden(uint64_t{C} * h), out(uint64_t{C} * T);
  matmul(x.data() + uint64_t{H} * D, C, D, w.head_w1.data(), h, w.head_b1.data(), hidden.data());
  for (double& v : hidden) v = silu(v);
  matmul(hidden.data(), C, h, w.head_w2.data(), T, w.head_b2.data(), out.data());
  for (uint64_t i = 0; i < out.size(); ++i) scores[i] = static_cast<float>(out[i]);
}

struct HstuFixtureCase {
  uint32_t history = 0, candidates = 0;
  std::vector<float> history_emb, candidate_emb, scores;
};

struct HstuFixture {
  HstuFlatWeights weights;
  uint64_t seed = 0;
  std::vector<HstuFixtureCase> cases;
};

inline constexpr char kHstuFixtureMagic[8] = {'H', 'L', 'E', 'M', 'H', 'S', 'T', 'F'};
inline constexpr uint32_t kHstuFixtureVersion = 1;
inline constexpr uint32_t kHstuFixtureMaxCases = 4096;
inline constexpr uint32_t kHstuFixtureMaxCandidates = 1u << 16;

// "" or why the file could not be written.
inline std::string WriteHstuFixture(const std::string& path, const HstuFixture& f) {
  if (std::string e = f.weights.Error(); !e.empty()) return "weights: " + e;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return "cannot open " + path + " for writing";
  auto put = [&](const void* p, size_t bytes) {
    out.write(static_cast<const char*>(p), static_cast<std::streamsize>(bytes));
  };
  auto u32 = [&](uint32_t v) { put(&v, 4); };
  const HstuFlatShape& s = f.weights.shape;
  put(kHstuFixtureMagic, 8);
  for (uint32_t v : {kHstuFixtureVersion, s.layers, s.dim, s.heads, s.d_qk, s.d_v, s.head_hidden,
                     s.targets, s.max_positions}) {
    u32(v);
  }
  put(&s.attn_norm, 4);
  put(&f.seed, 8);
  HstuFlatWeights::ForEachArray(f.weights,
                                [&](const std::string&, const std::vector<float>& a, uint64_t) {
                                  const uint64_t n = a.size();
                                  put(&n, 8);
                                  put(a.data(), n * 4);
                                });
  u32(static_cast<uint32_t>(f.cases.size()));
  for (const HstuFixtureCase& c : f.cases) {
    if (c.history_emb.size() != uint64_t{c.history} * s.dim ||
        c.candidate_emb.size() != uint64_t{c.candidates} * s.dim ||
        c.scores.size() != uint64_t{c.candidates} * s.targets) {
      return "a case's arrays do not match its history and candidate counts";
    }
    u32(c.history);
    u32(c.candidates);
    put(c.history_emb.data(), c.history_emb.size() * 4);
    put(c.candidate_emb.data(), c.candidate_emb.size() * 4);
    put(c.scores.data(), c.scores.size() * 4);
  }
  out.flush();
  return out ? "" : "write to " + path + " failed";
}

// "" and *f filled, or why the file is not a valid fixture (naming the part). Never allocates
// more than the file's bytes back: every count is checked against what is left of the file.
inline std::string ReadHstuFixture(const std::string& path, HstuFixture* f) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open " + path;
  in.seekg(0, std::ios::end);
  uint64_t left = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  auto get = [&](void* p, uint64_t bytes) {
    if (bytes > left) return false;
    in.read(static_cast<char*>(p), static_cast<std::streamsize>(bytes));
    left -= bytes;
    return static_cast<bool>(in);
  };
  auto floats = [&](std::vector<float>* v, uint64_t n) {
    if (n * 4 > left) return false;
    v->resize(n);
    return get(v->data(), n * 4);
  };
  char magic[8];
  uint32_t header[9];
  if (!get(magic, 8) || std::memcmp(magic, kHstuFixtureMagic, 8) != 0) {
    return "not an HSTU fixture (bad magic)";
  }
  if (!get(header, sizeof header)) return "truncated header";
  if (header[0] != kHstuFixtureVersion) return "unsupported version " + std::to_string(header[0]);
  HstuFlatWeights& w = f->weights;
  HstuFlatShape& s = w.shape;
  s = HstuFlatShape{};  // no designated initializers: nvcc compiles this header as C++17
  s.layers = header[1];
  s.dim = header[2];
  s.heads = header[3];
  s.d_qk = header[4];
  s.d_v = header[5];
  s.head_hidden = header[6];
  s.targets = header[7];
  s.max_positions = header[8];
  if (!get(&s.attn_norm, 4) || !get(&f->seed, 8)) return "truncated header";
  if (std::string e = s.Error(); !e.empty()) return "shape: " + e;
  w.layers.assign(s.layers, {});
  std::string error;
  HstuFlatWeights::ForEachArray(w, [&](const std::string& name, std::vector<float>& a,
                                       uint64_t want) {
    if (!error.empty()) return;
    uint64_t n = 0;
    if (!get(&n, 8)) {
      error = name + ": truncated";
    } else if (n != want) {
      error = name + ": " + std::to_string(n) + " values, the shape needs " + std::to_string(want);
    } else if (!floats(&a, n)) {
      error = name + ": truncated";
    }
  });
  if (!error.empty()) return error;
  if (std::string e = w.Error(); !e.empty()) return e;
  uint32_t cases = 0;
  if (!get(&cases, 4)) return "truncated before the case count";
  if (cases > kHstuFixtureMaxCases) return "more than 4096 cases";
  f->cases.assign(cases, {});
  for (uint32_t i = 0; i < cases; ++i) {
    HstuFixtureCase& c = f->cases[i];
    const std::string where = "case " + std::to_string(i) + ": ";
    if (!get(&c.history, 4) || !get(&c.candidates, 4)) return where + "truncated";
    if (c.history > s.max_positions) return where + "history past max_positions";
    if (c.candidates == 0 || c.candidates > kHstuFixtureMaxCandidates) {
      return where + "candidates must be in [1, 65536]";
    }
    if (!floats(&c.history_emb, uint64_t{c.history} * s.dim) ||
        !floats(&c.candidate_emb, uint64_t{c.candidates} * s.dim) ||
        !floats(&c.scores, uint64_t{c.candidates} * s.targets)) {
      return where + "truncated";
    }
  }
  if (left != 0) return std::to_string(left) + " bytes after the last case";
  return "";
}

}  // namespace hlem::serving
