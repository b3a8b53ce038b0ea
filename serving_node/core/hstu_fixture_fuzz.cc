// Fuzz target: HSTU fixture files (serving_node/core/hstu_flat.h) as ReadHstuFixture reads them
// (hlem_cuda_model on a GPU host). Every input is refused with a message or reads into weights
// that match their shape and cases whose arrays match their counts, on which the plain C++
// forward runs; never a crash, and never an allocation the file's bytes do not back.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "serving_node/core/hstu_flat.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path =
      std::string(getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp") + "/hlem_fixture_fuzz." +
      std::to_string(getpid());
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  hlem::serving::HstuFixture fixture;
  const std::string error = hlem::serving::ReadHstuFixture(path, &fixture);
  if (!error.empty()) return 0;
  const hlem::serving::HstuFlatWeights& w = fixture.weights;
  if (!w.Error().empty()) __builtin_trap();
  for (const hlem::serving::HstuFixtureCase& c : fixture.cases) {
    if (c.history_emb.size() != uint64_t{c.history} * w.shape.dim ||
        c.candidate_emb.size() != uint64_t{c.candidates} * w.shape.dim ||
        c.scores.size() != uint64_t{c.candidates} * w.shape.targets) {
      __builtin_trap();
    }
    // The file backs every weight, so a forward over a few tokens stays small.
    if (c.history + c.candidates <= 16) {
      std::vector<float> scores(c.scores.size());
      hlem::serving::HstuForwardHost(w, c.history_emb.data(), c.history, c.candidate_emb.data(),
                                     c.candidates, scores.data());
    }
  }
  return 0;
}
