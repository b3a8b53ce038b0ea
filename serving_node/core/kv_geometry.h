#pragma once
// Where K/V bytes live: inside a KV page, and in the token-major batch a model step produces.
// Pure arithmetic with no dependencies, shared by the KV cache, the cpu device and the CUDA
// kernels (nvcc compiles it into device code), so the three cannot disagree.

#include <cstdint>

#if defined(__CUDACC__)
#define HLEM_HOST_DEVICE __host__ __device__
#else
#define HLEM_HOST_DEVICE
#endif

namespace hlem::serving {

enum class KvPart : uint8_t { kKey = 0, kValue = 1 };

struct KvGeometry {
  uint32_t layers = 0;
  uint32_t kv_dim = 0;  // elements per token per layer, for K and for V
  uint32_t dtype_bytes = 0;
  uint64_t page_bytes = 0;
  uint32_t page_tokens = 0;  // page_bytes / token_bytes()

  // Bytes of one token's K (or V) vector in one layer.
  HLEM_HOST_DEVICE uint64_t vector_bytes() const { return uint64_t{kv_dim} * dtype_bytes; }
  // Bytes of one token's K and V in every layer.
  HLEM_HOST_DEVICE uint64_t token_bytes() const { return uint64_t{layers} * 2 * vector_bytes(); }
  // Byte offset, inside a page, of the K or V vector of token slot `slot` in `layer`: a page is
  // [layer][K, V][slot][kv_dim], so one layer's K of consecutive tokens is contiguous (what the
  // attention kernel reads).
  HLEM_HOST_DEVICE uint64_t OffsetInPage(uint32_t layer, KvPart part, uint32_t slot) const {
    return ((uint64_t{layer} * 2 + static_cast<uint64_t>(part)) * page_tokens + slot) *
           vector_bytes();
  }
  // Byte offset of the K or V vector of token `token` in `layer` in a batch of new tokens as the
  // model writes it: [token][layer][K, V][kv_dim].
  HLEM_HOST_DEVICE uint64_t OffsetInBatch(uint64_t token, uint32_t layer, KvPart part) const {
    return ((token * layers + layer) * 2 + static_cast<uint64_t>(part)) * vector_bytes();
  }
};

}  // namespace hlem::serving
