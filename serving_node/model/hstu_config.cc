#include "serving_node/model/hstu_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hlem::serving {

uint64_t HstuConfig::ParameterCount() const {
  const uint64_t D = dim, hv = uint64_t{heads} * d_v, uvqk = uvqk_dim();
  const uint64_t per_layer = 2 * D + D * uvqk + uvqk + 2 * hv + hv * D;
  return (uint64_t{max_positions} + 1) * D + uint64_t{layers} * per_layer + D * head_hidden +
         head_hidden + uint64_t{head_hidden} * targets + targets;
}

absl::Status HstuConfig::Validate() const {
  auto positive = [](const char* field, uint32_t v) -> absl::Status {
    if (v == 0) return absl::InvalidArgumentError(absl::StrCat("model.", field, ": must be > 0"));
    return absl::OkStatus();
  };
  for (auto [field, v] :
       {std::pair{"layers", layers}, std::pair{"dim", dim}, std::pair{"heads", heads},
        std::pair{"d_qk", d_qk}, std::pair{"d_v", d_v}, std::pair{"head_hidden", head_hidden},
        std::pair{"targets", targets}, std::pair{"max_positions", max_positions}}) {
    if (absl::Status st = positive(field, v); !st.ok()) return st;
  }
  if (!(attn_norm > 0) || !std::isfinite(attn_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.attn_norm: must be a positive number, got ", attn_norm));
  }
  if (const uint64_t n = ParameterCount(); n > kMaxParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: ", n,
                     " weights (layers, dim, heads, d_qk, d_v, head_hidden, max_positions) "
                     "exceed the limit of ",
                     kMaxParameters, " (8 GiB of fp32)"));
  }
  return absl::OkStatus();
}

}  // namespace hlem::serving
