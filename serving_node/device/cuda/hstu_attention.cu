#include "serving_node/device/cuda/hstu_attention.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

namespace hlem::cuda {
namespace {

#define HLEM_KERNEL(threads) __global__ void __launch_bounds__(threads)
#define HLEM_DEVICE_FN __device__
#define HLEM_UNROLL _Pragma("unroll")
#define HLEM_SHARED_FLOATS(name) extern __shared__ float name[]
#include "serving_node/device/cuda/hstu_attention_kernel.inc"

}  // namespace

std::string LaunchHstuAttention(const HstuAttentionArgs& args, void* stream,
                                HstuAttentionMath math) {
  if (const char* why = HstuAttentionArgsError(args); why[0] != '\0') {
    return std::string("HstuAttention: ") + why;
  }
  if (math == HstuAttentionMath::kBf16 && HstuAttentionBf16Supports(args)) {
    return LaunchHstuAttentionBf16(args, stream);
  }
  const HstuAttentionShape& s = args.shape;
  if (s.rows() == 0) return "";
  // Narrow heads keep half the accumulators (fewer registers, more resident blocks).
  void (*kernel)(HstuAttentionArgs, float, float) =
      s.d_v <= 128 ? HstuAttentionKernel<AccFor(128)> : HstuAttentionKernel<AccFor(kMaxHeadDim)>;
  const size_t smem = SmemBytes(s.d_qk, s.d_v);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) {
      return std::string("HstuAttention: cudaFuncSetAttribute: ") + cudaGetErrorString(e);
    }
  }
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return "HstuAttention: cannot read the device's multiprocessor count";
  }
  const uint32_t splits = HstuAttentionSplits(s, static_cast<uint32_t>(sms));
  const dim3 grid((s.rows() + kQueryTile - 1) / kQueryTile, s.heads, splits);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (splits > 1) {
    const cudaError_t e =
        cudaMemsetAsync(args.out, 0, sizeof(float) * s.rows() * uint64_t{s.heads} * s.d_v, st);
    if (e != cudaSuccess) {
      return std::string("HstuAttention: cudaMemsetAsync: ") + cudaGetErrorString(e);
    }
  }
  (void)cudaGetLastError();  // clear an earlier, unrelated error of this thread
  kernel<<<grid, kThreads, smem, st>>>(args, 1.0f / sqrtf(static_cast<float>(s.d_qk)),
                                       1.0f / s.attn_norm);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return std::string("HstuAttention: launch: ") + cudaGetErrorString(e);
  return "";
}

}  // namespace hlem::cuda
