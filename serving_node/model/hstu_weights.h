#pragma once
// HstuModel's weights as torch tensors, shared by hstu_model.cc (the forwards) and
// hstu_weights.cc (the state-dict file). Includes ATen: for the model's .cc files only.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "serving_node/model/hstu_model.h"

namespace hlem::serving {

// One layer; matrices are stored for x · W (the file holds them transposed, as nn.Linear).
struct HstuLayer {
  at::Tensor ln1_w, ln1_b;  // [D]
  at::Tensor w_uvqk;        // [D, heads·(2 d_v + 2 d_qk)]
  at::Tensor b_uvqk;        // [heads·(2 d_v + 2 d_qk)]
  at::Tensor ln2_w, ln2_b;  // [heads·d_v]
  at::Tensor w_o;           // [heads·d_v, D]
};

struct HstuModel::Weights {
  at::Tensor pos;  // [max_positions + 1, D]
  std::vector<HstuLayer> layers;
  at::Tensor head_w1, head_b1, head_w2, head_b2;  // [D, h], [h], [h, T], [T]
};

// The state dict of a model of `config`: names (docs/model.md) and tensors in nn.Linear layout.
std::vector<std::pair<std::string, at::Tensor>> HstuStateDict(const HstuConfig& config,
                                                              const HstuModel::Weights& w);

}  // namespace hlem::serving
