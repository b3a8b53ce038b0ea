// hlem_hstu_fixture: writes an HSTU fixture (serving_node/core/hstu_flat.h) from the libtorch
// runner: random weights from --seed, requests of several history lengths with random feature
// sums, and ForwardReference's scores for them. scripts/gpu-check.sh --bundle writes two
// (presets `small` and `paper`) for hlem_cuda_model to check the CUDA runner against, on a GPU
// host that has no libtorch.
//
//   hlem_hstu_fixture --out FILE [--preset tiny|small|paper] [--seed N]

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "serving_node/core/hstu_flat.h"
#include "serving_node/model/hstu_model.h"

namespace hlem::serving {
namespace {

struct Preset {
  HstuConfig config;
  std::vector<std::pair<uint32_t, uint32_t>> cases;  // (history, candidates)
};

Preset PresetNamed(const std::string& name) {
  if (name == "tiny") {  // a few hundred bytes: the fuzz target's seed corpus
    return {{.layers = 1,
             .dim = 4,
             .heads = 1,
             .d_qk = 2,
             .d_v = 2,
             .head_hidden = 3,
             .targets = 1,
             .attn_norm = 4,
             .max_positions = 6},
            {{0, 1}, {3, 2}}};
  }
  if (name == "paper") {  // the paper's layer (512-dim, 4 heads of 128), 3 layers, 100 candidates
    return {{.layers = 3,
             .dim = 512,
             .heads = 4,
             .d_qk = 128,
             .d_v = 128,
             .head_hidden = 256,
             .targets = 1,
             .attn_norm = 1024,
             .max_positions = 2048},
            {{17, 100}, {1000, 100}}};
  }
  // Small, with K and V of different widths (K padded in the page) and two targets.
  return {{.layers = 2,
           .dim = 64,
           .heads = 2,
           .d_qk = 24,
           .d_v = 32,
           .head_hidden = 48,
           .targets = 2,
           .attn_norm = 64,
           .max_positions = 1024},
          {{0, 3}, {1, 1}, {2, 7}, {63, 20}, {300, 100}, {777, 33}}};
}

int Main(int argc, char** argv) {
  CLI::App app("writes an HSTU fixture: weights, requests and the libtorch runner's scores");
  std::string out, preset = "small";
  uint64_t seed = 1;
  app.add_option("--out", out, "fixture file to write")->required();
  app.add_option("--preset", preset, "model and requests")
      ->check(CLI::IsMember({"tiny", "small", "paper"}));
  app.add_option("--seed", seed, "weights and inputs are drawn from it");
  CLI11_PARSE(app, argc, argv);

  const Preset p = PresetNamed(preset);
  auto model = HstuModel::CreateRandom(p.config, seed);
  if (!model.ok()) {
    std::fprintf(stderr, "hlem_hstu_fixture: %s\n", model.status().ToString().c_str());
    return 1;
  }
  HstuFixture f{.weights = (*model)->Flatten(), .seed = seed, .cases = {}};
  std::mt19937_64 rng(seed ^ 0x5eedf17eULL);
  std::normal_distribution<float> emb(0, 0.3f);
  for (const auto& [history, candidates] : p.cases) {
    HstuFixtureCase c{.history = history, .candidates = candidates};
    c.history_emb.resize(uint64_t{history} * p.config.dim);
    c.candidate_emb.resize(uint64_t{candidates} * p.config.dim);
    for (float& x : c.history_emb) x = emb(rng);
    for (float& x : c.candidate_emb) x = emb(rng);
    c.scores.resize(uint64_t{candidates} * p.config.targets);
    if (absl::Status st = (*model)->ForwardReference(c.history_emb, c.candidate_emb, c.scores);
        !st.ok()) {
      std::fprintf(stderr, "hlem_hstu_fixture: %s\n", st.ToString().c_str());
      return 1;
    }
    f.cases.push_back(std::move(c));
  }
  if (std::string e = WriteHstuFixture(out, f); !e.empty()) {
    std::fprintf(stderr, "hlem_hstu_fixture: %s\n", e.c_str());
    return 1;
  }
  std::printf("hlem_hstu_fixture: %s (preset %s, seed %llu, %zu cases)\n", out.c_str(),
              preset.c_str(), static_cast<unsigned long long>(seed), f.cases.size());
  return 0;
}

}  // namespace
}  // namespace hlem::serving

int main(int argc, char** argv) { return hlem::serving::Main(argc, argv); }
