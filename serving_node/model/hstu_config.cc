#include "serving_node/model/hstu_config.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hlem::serving {

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
  return absl::OkStatus();
}

}  // namespace hlem::serving
