// The paged HSTU attention kernel (hstu_attention_kernel.inc) run without a GPU: each block's
// threads are std::threads meeting at a std::barrier for __syncthreads, shared memory is a
// per-block buffer poisoned with NaN, atomicAdd is an atomic_ref. The kernel's own indexing,
// masking, tiling and key splits are checked against HstuAttentionHost on the shapes the GPU check
// runs (hlem_cuda_attention), on a 132- and a 4-multiprocessor device (other splits).

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "serving_node/device/cuda/hstu_attention.h"
#include "serving_node/device/cuda/hstu_attention_testing.h"

namespace hlem::cuda {
namespace emu {

struct Index3 {
  uint32_t x = 0, y = 0, z = 0;
};
thread_local Index3 threadIdx, blockIdx;
Index3 gridDim;  // set before the threads start
thread_local std::barrier<>* block_barrier = nullptr;
thread_local float* block_smem = nullptr;

void __syncthreads() { block_barrier->arrive_and_wait(); }
float __expf(float x) { return std::exp(x); }
void atomicAdd(float* p, float v) { std::atomic_ref<float>(*p).fetch_add(v); }
using std::min;

#define HLEM_KERNEL(threads) void
#define HLEM_DEVICE_FN
#define HLEM_UNROLL
#define HLEM_SHARED_FLOATS(name) float* name = block_smem
#include "serving_node/device/cuda/hstu_attention_kernel.inc"
#undef HLEM_KERNEL
#undef HLEM_DEVICE_FN
#undef HLEM_UNROLL
#undef HLEM_SHARED_FLOATS

// LaunchHstuAttention's work, one block at a time.
uint32_t Launch(const HstuAttentionArgs& args, uint32_t sms) {
  const HstuAttentionShape& s = args.shape;
  if (s.rows() == 0) return 0;
  const uint32_t splits = HstuAttentionSplits(s, sms);
  if (splits > 1) std::fill(args.out, args.out + uint64_t{s.rows()} * s.heads * s.d_v, 0.0f);
  gridDim = {(s.rows() + kQueryTile - 1) / kQueryTile, s.heads, splits};
  std::vector<float> smem(SmemBytes(s.d_qk, s.d_v) / sizeof(float));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d_qk)), inv_norm = 1.0f / s.attn_norm;
  // kThreads threads run every block in turn, meeting at the barrier between blocks (a kernel
  // that leaves early leaves for the whole block, so every thread passes the same barriers).
  std::barrier<> barrier(kThreads);
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      threadIdx = {t, 0, 0};
      block_barrier = &barrier;
      block_smem = smem.data();
      for (uint32_t z = 0; z < gridDim.z; ++z) {
        for (uint32_t y = 0; y < gridDim.y; ++y) {
          for (uint32_t x = 0; x < gridDim.x; ++x) {
            if (t == 0) std::fill(smem.begin(), smem.end(), NAN);
            barrier.arrive_and_wait();
            blockIdx = {x, y, z};
            if (s.d_v <= 128) {
              HstuAttentionKernel<AccFor(128)>(args, scale, inv_norm);
            } else {
              HstuAttentionKernel<AccFor(kMaxHeadDim)>(args, scale, inv_norm);
            }
            barrier.arrive_and_wait();
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  return splits;
}

}  // namespace emu

namespace {

TEST(HstuAttentionKernelEmulationTest, MatchesTheHostReference) {
  uint64_t seed = 1;
  int split_cases = 0;
  for (const HstuAttentionShape& s : AttentionCheckShapes(6, 2026)) {
    for (uint32_t sms : {132u, 4u}) {
      HostAttentionCase c(s, 1 + seed % 23, 3, seed % 3, seed % 2 == 0, seed);
      ++seed;
      std::vector<float> want(c.out.size()), got(c.out.size(), NAN);
      HstuAttentionHost(c.args);
      want = c.out;
      HstuAttentionArgs args = c.args;
      args.out = got.data();
      ASSERT_STREQ(HstuAttentionArgsError(args), "");
      const uint32_t splits = emu::Launch(args, sms);
      split_cases += splits > 1;
      EXPECT_LE(RelativeError(got, want), 1e-5)
          << "heads " << s.heads << " d_qk " << s.d_qk << " d_v " << s.d_v << " cached " << s.cached
          << " fresh " << s.fresh << " candidates " << s.candidates << " splits " << splits;
    }
  }
  EXPECT_GE(split_cases, 4);  // the split path ran, not only the direct one
}

TEST(HstuAttentionKernelEmulationTest, SplitsKeepEnoughKeysEach) {
  const HstuAttentionShape returning{.heads = 4,
                                     .d_qk = 128,
                                     .d_v = 128,
                                     .attn_norm = 64,
                                     .cached = 14850,
                                     .fresh = 150,
                                     .candidates = 100};
  const uint32_t splits = emu::HstuAttentionSplits(returning, 132);
  EXPECT_GT(splits, 1u);
  EXPECT_GE((returning.history() + emu::kKeyTile - 1) / emu::kKeyTile / splits, 8u);
  const HstuAttentionShape cold{
      .heads = 4, .d_qk = 128, .d_v = 128, .attn_norm = 64, .fresh = 15000, .candidates = 100};
  EXPECT_EQ(emu::HstuAttentionSplits(cold, 132), 1u);  // 3 776 blocks fill the device already
  const HstuAttentionShape empty{.heads = 1, .d_qk = 8, .d_v = 8, .attn_norm = 1, .candidates = 1};
  EXPECT_EQ(emu::HstuAttentionSplits(empty, 132), 1u);
}

}  // namespace
}  // namespace hlem::cuda
