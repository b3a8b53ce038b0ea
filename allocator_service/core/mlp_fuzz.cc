// Fuzz target: policy weight files (hlem-mlp text, allocator --weights). A file the parser accepts
// must run: a forward pass on any finite input gives finite outputs, and the weights serialize
// and parse back.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "allocator_service/core/mlp.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<hlem::allocator::Mlp> mlp =
      hlem::allocator::Mlp::Parse(std::string(reinterpret_cast<const char*>(data), size));
  if (!mlp.ok()) return 0;
  if (mlp->parameters() > (1u << 22)) return 0;  // a legal but large net: not this target's point
  std::vector<float> x(mlp->inputs(), 1.5f), y(mlp->outputs());
  mlp->Forward(x, y);
  for (float v : y) {
    if (!std::isfinite(v)) __builtin_trap();
  }
  if (!hlem::allocator::Mlp::Parse(mlp->Serialize()).ok()) __builtin_trap();
  return 0;
}
