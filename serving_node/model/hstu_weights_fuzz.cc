// Fuzz target: model weight files (torch.save state dicts, the node config's `weights`) as
// HstuModel::Load reads them, for a small config. Every input is either refused with
// INVALID_ARGUMENT (not a state dict, a missing, unexpected, misshapen, non-float or non-finite
// tensor) or loads into a model whose forward gives finite scores; never a crash.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "serving_node/model/hstu_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const hlem::serving::HstuConfig config{.layers = 1,
                                                .dim = 8,
                                                .heads = 2,
                                                .d_qk = 4,
                                                .d_v = 4,
                                                .head_hidden = 8,
                                                .targets = 2,
                                                .attn_norm = 8,
                                                .max_positions = 16};
  static const std::string path =
      std::string(getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp") + "/hlem_weights_fuzz." +
      std::to_string(getpid());
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  auto model = hlem::serving::HstuModel::Load(config, path);
  if (!model.ok()) {
    if (model.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  std::vector<float> history(3 * config.dim), candidates(2 * config.dim),
      scores(2 * config.targets);
  for (size_t i = 0; i < history.size(); ++i) history[i] = static_cast<float>(i % 7) / 7 - 0.5f;
  for (size_t i = 0; i < candidates.size(); ++i) candidates[i] = static_cast<float>(i % 5) / 5;
  if (!(*model)->ForwardReference(history, candidates, scores).ok()) __builtin_trap();
  for (float s : scores) {
    if (!std::isfinite(s)) __builtin_trap();
  }
  return 0;
}
