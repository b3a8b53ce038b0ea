// The paged attention's host reference (the CUDA kernel's CPU twin) against a dense formulation
// written the way the CPU runner builds it (hstu_model.cc): keys = history K (cached, then new)
// followed by the candidates' K, a 0/1 mask with the new tokens causal over history and each
// candidate seeing all history and itself, A = (SiLU(Q Kᵀ / √d_qk) / N ⊙ M) V per head.

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "serving_node/device/cuda/hstu_attention.h"
#include "serving_node/device/cuda/hstu_attention_testing.h"

namespace hlem::cuda {
namespace {

using serving::KvGeometry;
using serving::KvPart;

void CompareWithDense(const HstuAttentionShape& s, uint32_t page_tokens, uint64_t seed) {
  HostAttentionCase c(s, page_tokens, 2, 1, /*shuffled=*/true, seed);
  const KvGeometry& g = c.args.geometry;
  const uint32_t layer = 1, total = s.history(), rows = s.rows();
  const uint32_t hq = s.heads * s.d_qk, hv = s.heads * s.d_v;
  const std::vector<uint64_t>& page_offsets = c.pages;
  const float* pool = reinterpret_cast<const float*>(c.pool.data());
  const std::vector<float>&q = c.q, &ck = c.cand_k, &cv = c.cand_v;
  std::fill(c.out.begin(), c.out.end(), NAN);
  ASSERT_STREQ(HstuAttentionArgsError(c.args), "");
  HstuAttentionHost(c.args);
  const std::vector<float>& out = c.out;

  // Dense keys and values: history token j read from its page, then the candidates.
  const uint32_t m = total + s.candidates;
  std::vector<float> K(uint64_t{m} * hq), V(uint64_t{m} * hv);
  for (uint32_t j = 0; j < total; ++j) {
    const uint64_t page = page_offsets[j / page_tokens] / 4;
    const uint64_t k_at = page + g.OffsetInPage(layer, KvPart::kKey, j % page_tokens) / 4;
    const uint64_t v_at = page + g.OffsetInPage(layer, KvPart::kValue, j % page_tokens) / 4;
    std::copy(pool + k_at, pool + k_at + hq, K.begin() + uint64_t{j} * hq);
    std::copy(pool + v_at, pool + v_at + hv, V.begin() + uint64_t{j} * hv);
  }
  std::copy(ck.begin(), ck.end(), K.begin() + uint64_t{total} * hq);
  std::copy(cv.begin(), cv.end(), V.begin() + uint64_t{total} * hv);
  // The mask as hstu_model.cc builds it.
  std::vector<uint8_t> M(uint64_t{rows} * m, 0);
  for (uint32_t i = 0; i < s.fresh; ++i) {
    for (uint32_t j = 0; j <= s.cached + i; ++j) M[uint64_t{i} * m + j] = 1;
  }
  for (uint32_t r = 0; r < s.candidates; ++r) {
    for (uint32_t j = 0; j < total; ++j) M[uint64_t{s.fresh + r} * m + j] = 1;
    M[uint64_t{s.fresh + r} * m + total + r] = 1;
  }
  // A = (SiLU(Q Kᵀ / √d_qk) / N ⊙ M) V, a score matrix per head.
  std::vector<float> dense(out.size());
  std::vector<double> w(m);
  for (uint32_t h = 0; h < s.heads; ++h) {
    for (uint32_t i = 0; i < rows; ++i) {
      for (uint32_t j = 0; j < m; ++j) {
        double dot = 0;
        for (uint32_t d = 0; d < s.d_qk; ++d) {
          dot +=
              double{q[uint64_t{i} * hq + h * s.d_qk + d]} * K[uint64_t{j} * hq + h * s.d_qk + d];
        }
        const double x = dot / std::sqrt(static_cast<double>(s.d_qk));
        w[j] = x / (1 + std::exp(-x)) / s.attn_norm * M[uint64_t{i} * m + j];
      }
      for (uint32_t e = 0; e < s.d_v; ++e) {
        double a_ie = 0;
        for (uint32_t j = 0; j < m; ++j) a_ie += w[j] * V[uint64_t{j} * hv + h * s.d_v + e];
        dense[uint64_t{i} * hv + h * s.d_v + e] = static_cast<float>(a_ie);
      }
    }
  }
  EXPECT_LE(RelativeError(out, dense), 1e-6) << "cached " << s.cached << " fresh " << s.fresh;
}

TEST(HstuAttentionReferenceTest, MatchesTheDenseMaskedFormulation) {
  uint64_t seed = 1;
  for (const HstuAttentionShape& s : AttentionCheckShapes(4, 7)) {
    CompareWithDense(s, 1 + seed % 17, seed);
    ++seed;
  }
}

TEST(HstuAttentionReferenceTest, RefusesWhatTheKernelCannotRun) {
  HstuAttentionArgs a;
  a.shape = {.heads = 2, .d_qk = 16, .d_v = 16, .attn_norm = 1, .candidates = 1};
  a.geometry = {.layers = 1, .kv_dim = 32, .dtype_bytes = 4, .page_bytes = 256, .page_tokens = 1};
  EXPECT_STREQ(HstuAttentionArgsError(a), "");
  HstuAttentionArgs b = a;
  b.shape.d_qk = 512;
  EXPECT_STRNE(HstuAttentionArgsError(b), "");
  b = a;
  b.geometry.dtype_bytes = 2;
  EXPECT_STRNE(HstuAttentionArgsError(b), "");
  b = a;
  b.geometry.kv_dim = 31;
  EXPECT_STRNE(HstuAttentionArgsError(b), "");
  b = a;
  b.shape.attn_norm = 0;
  EXPECT_STRNE(HstuAttentionArgsError(b), "");
  b = a;
  b.layer = 1;
  EXPECT_STRNE(HstuAttentionArgsError(b), "");
}

}  // namespace
}  // namespace hlem::cuda
