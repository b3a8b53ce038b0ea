// The paged HSTU attention on tensor cores (hstu_attention.h, HstuAttentionMath::kBf16): the same
// computation as the fp32 kernel (hstu_attention_kernel.inc), with QKᵀ and S·V as bf16 mma.sync
// (m16n8k16, fp32 accumulation). K/V stay fp32 in the pages; a tile is rounded to bf16 as it is
// copied into shared memory, Q once per block, the scores S after the SiLU and the mask. Each
// candidate's own term (its K/V are not in the pages) is added in fp32, as in the fp32 kernel.
//
// A block holds 64 query rows of one head (4 warps of 16 rows) and walks its split of the keys in
// tiles of 64: the warps copy the tile's K and V rows (float4 loads, 8 keys in flight a warp) into
// shared memory as bf16, then each warp computes its 16 × 64 scores with the Q fragments it keeps
// in registers, turns them into S in registers (the accumulator layout of one mma is the operand
// layout of the next, so S never leaves the registers), and adds S · V into 16 × d accumulators;
// V's operand fragments come through ldmatrix.trans. Splits add atomically, as in the fp32 kernel.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "serving_node/device/cuda/hstu_attention.h"

namespace hlem::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // query rows a block
constexpr int kKeys = 64;           // keys a tile
constexpr int kPad = 8;             // bf16 elements after each shared row (no bank conflicts)
constexpr int kKeysInFlight = 8;    // keys a warp loads before it stores them

__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t Load32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += a · b: a is 16 × 16 (row-major fragment), b is 16 × 8 (column fragment), c is 16 × 8.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two 8 × 8 bf16 matrices, transposed: lanes 0-7 give the rows of the first, 8-15 of the second.
__device__ __forceinline__ void LoadMatrixX2Trans(uint32_t& r0, uint32_t& r1, const void* row) {
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(at));
}

__device__ __forceinline__ float SiluF(float x) { return x / (1.0f + __expf(-x)); }

constexpr size_t SmemBytes(int d) {
  return sizeof(__nv_bfloat16) * (size_t{kRows} + 2 * kKeys) * (d + kPad) +
         2 * sizeof(const float*) * kKeys + sizeof(float) * kRows;
}

// d_qk = d_v = kD, a multiple of 16.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    HstuAttentionMmaKernel(HstuAttentionArgs a, float scale, float inv_norm) {
  constexpr int kStride = kD + kPad;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem);  // [kRows][kStride]
  __nv_bfloat16* k_s = q_s + kRows * kStride;                   // [kKeys][kStride]
  __nv_bfloat16* v_s = k_s + kKeys * kStride;                   // [kKeys][kStride]
  const float** k_at = reinterpret_cast<const float**>(v_s + kKeys * kStride);
  const float** v_at = k_at + kKeys;
  float* self_s = reinterpret_cast<float*>(v_at + kKeys);  // [kRows]

  const HstuAttentionShape& s = a.shape;
  const serving::KvGeometry& g = a.geometry;
  const uint32_t h = blockIdx.y, hd = s.heads * kD;
  const uint32_t q0 = blockIdx.x * kRows, total_rows = s.rows();
  const uint32_t rows = min(static_cast<uint32_t>(kRows), total_rows - q0);
  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t gid = lane / 4, tig = lane % 4;
  const bool split = gridDim.z > 1;

  // This split's keys, as in the fp32 kernel: the tiles of the longest history, cut evenly.
  const uint32_t last = q0 + rows - 1;
  const uint32_t keys = last >= s.fresh ? s.history() : s.cached + last + 1;
  const uint32_t tiles = (s.history() + kKeys - 1) / kKeys;
  const uint32_t per_split = (tiles + gridDim.z - 1) / gridDim.z;
  const uint32_t k_begin = blockIdx.z * per_split * kKeys;
  const uint32_t k_end = min(keys, (blockIdx.z + 1) * per_split * kKeys);
  if (blockIdx.z > 0 && k_begin >= k_end) return;  // the whole block: no barrier waits for it

  for (uint32_t x = threadIdx.x; x < kRows * kD / 2; x += kThreads) {
    const uint32_t r = x / (kD / 2), e = x % (kD / 2) * 2;
    float lo = 0.0f, hi = 0.0f;
    if (r < rows) {
      const float* q = a.q + uint64_t{q0 + r} * hd + h * kD + e;
      lo = q[0];
      hi = q[1];
    }
    *reinterpret_cast<uint32_t*>(q_s + r * kStride + e) = Pack(lo, hi);
  }
  __syncthreads();
  // The warp's 16 query rows as mma operands, all of d_qk.
  const uint32_t wr = warp * 16;
  uint32_t qf[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const __nv_bfloat16* p = q_s + (wr + gid) * kStride + kk * 16 + 2 * tig;
    qf[kk][0] = Load32(p);
    qf[kk][1] = Load32(p + 8 * kStride);
    qf[kk][2] = Load32(p + 8);
    qf[kk][3] = Load32(p + 8 * kStride + 8);
  }
  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // The two query rows this thread's fragments hold, and the keys each may see.
  const uint32_t row0 = q0 + wr + gid, row1 = row0 + 8;
  const uint32_t limit0 =
      row0 >= total_rows ? 0 : min(k_end, row0 >= s.fresh ? s.history() : s.cached + row0 + 1);
  const uint32_t limit1 =
      row1 >= total_rows ? 0 : min(k_end, row1 >= s.fresh ? s.history() : s.cached + row1 + 1);

  for (uint32_t k0 = k_begin; k0 < k_end; k0 += kKeys) {
    if (threadIdx.x < kKeys) {
      const uint32_t j = k0 + threadIdx.x;
      const float* kp = nullptr;
      const float* vp = nullptr;
      if (j < k_end) {
        const std::byte* page = a.pool + a.page_offsets[j / g.page_tokens];
        const uint32_t slot = j % g.page_tokens;
        kp = reinterpret_cast<const float*>(page +
                                            g.OffsetInPage(a.layer, serving::KvPart::kKey, slot)) +
             h * kD;
        vp = reinterpret_cast<const float*>(
                 page + g.OffsetInPage(a.layer, serving::KvPart::kValue, slot)) +
             h * kD;
      }
      k_at[threadIdx.x] = kp;
      v_at[threadIdx.x] = vp;
    }
    __syncthreads();
    // Warp w copies keys w, w + 4, ...; lanes along the vector, 4 floats each; keys past the end
    // are zeros (a masked score times a NaN from an unwritten slot would still be NaN).
#pragma unroll
    for (int i0 = 0; i0 < kKeys / kWarps; i0 += kKeysInFlight) {
#pragma unroll
      for (uint32_t e = lane * 4; e < static_cast<uint32_t>(kD); e += 128) {
        float4 kr[kKeysInFlight], vr[kKeysInFlight];
#pragma unroll
        for (int i = 0; i < kKeysInFlight; ++i) {
          const uint32_t t = warp + (i0 + i) * kWarps;
          const float* kp = k_at[t];
          const float* vp = v_at[t];
          kr[i] = kp != nullptr ? *reinterpret_cast<const float4*>(kp + e) : float4{};
          vr[i] = vp != nullptr ? *reinterpret_cast<const float4*>(vp + e) : float4{};
        }
#pragma unroll
        for (int i = 0; i < kKeysInFlight; ++i) {
          const uint32_t t = warp + (i0 + i) * kWarps;
          *reinterpret_cast<uint2*>(k_s + t * kStride + e) =
              make_uint2(Pack(kr[i].x, kr[i].y), Pack(kr[i].z, kr[i].w));
          *reinterpret_cast<uint2*>(v_s + t * kStride + e) =
              make_uint2(Pack(vr[i].x, vr[i].y), Pack(vr[i].z, vr[i].w));
        }
      }
    }
    __syncthreads();
    // Scores of the warp's 16 rows against the tile's 64 keys.
    float sc[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
      const __nv_bfloat16* kb = k_s + (n * 8 + gid) * kStride + 2 * tig;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        Mma(sc[n], qf[kk], Load32(kb + kk * 16), Load32(kb + kk * 16 + 8));
    }
    // S = SiLU(score · scale) / N where the mask lets the pair through, as the next mma's operand.
    uint32_t pf[kKeys / 16][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      const uint32_t j = k0 + n * 8 + 2 * tig;
      const float w0 = j < limit0 ? SiluF(sc[n][0] * scale) * inv_norm : 0.0f;
      const float w1 = j + 1 < limit0 ? SiluF(sc[n][1] * scale) * inv_norm : 0.0f;
      const float w2 = j < limit1 ? SiluF(sc[n][2] * scale) * inv_norm : 0.0f;
      const float w3 = j + 1 < limit1 ? SiluF(sc[n][3] * scale) * inv_norm : 0.0f;
      pf[n / 2][(n % 2) * 2] = Pack(w0, w1);
      pf[n / 2][(n % 2) * 2 + 1] = Pack(w2, w3);
    }
    // A += S · V.
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t b0, b1;
        LoadMatrixX2Trans(b0, b1, v_s + (kk * 16 + lane % 16) * kStride + n * 8);
        Mma(o[n], pf[kk], b0, b1);
      }
    }
    __syncthreads();  // the next tile overwrites k_at, v_at, k_s and v_s
  }

  // Each candidate's own key, in fp32 (split 0 adds it), then the output.
  if (threadIdx.x < kRows) {
    const uint32_t r = threadIdx.x, row = q0 + r;
    float w = 0.0f;
    if (r < rows && row >= s.fresh && blockIdx.z == 0) {
      const float* q = a.q + uint64_t{row} * hd + h * kD;
      const float* k = a.cand_k + uint64_t{row - s.fresh} * hd + h * kD;
      float dot = 0.0f;
      for (int e = 0; e < kD; ++e) dot += q[e] * k[e];
      w = SiluF(dot * scale) * inv_norm;
    }
    self_s[r] = w;
  }
  __syncthreads();
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t r = wr + gid + half * 8, row = q0 + r, col = n * 8 + 2 * tig;
      if (r >= rows) continue;
      float v0 = o[n][half * 2], v1 = o[n][half * 2 + 1];
      if (row >= s.fresh && blockIdx.z == 0) {
        const float* cv = a.cand_v + uint64_t{row - s.fresh} * hd + h * kD + col;
        v0 += self_s[r] * cv[0];
        v1 += self_s[r] * cv[1];
      }
      float* out = a.out + uint64_t{row} * hd + h * kD + col;
      if (split) {
        atomicAdd(out, v0);
        atomicAdd(out + 1, v1);
      } else {
        out[0] = v0;
        out[1] = v1;
      }
    }
  }
}

template <int kD>
std::string Launch(const HstuAttentionArgs& args, cudaStream_t stream) {
  const HstuAttentionShape& s = args.shape;
  void (*kernel)(HstuAttentionArgs, float, float) = HstuAttentionMmaKernel<kD>;
  const size_t smem = SmemBytes(kD);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) {
      return std::string("HstuAttention (bf16): cudaFuncSetAttribute: ") + cudaGetErrorString(e);
    }
  }
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return "HstuAttention (bf16): cannot read the device's multiprocessor count";
  }
  // Key splits: about four waves of blocks, each split at least 4 key tiles, at most 1024.
  const uint32_t query_blocks = (s.rows() + kRows - 1) / kRows * s.heads;
  const uint32_t key_tiles = (s.history() + kKeys - 1) / kKeys;
  const uint32_t splits =
      std::max(1u, std::min({(4 * static_cast<uint32_t>(sms) + query_blocks - 1) / query_blocks,
                             key_tiles / 4, 1024u}));
  if (splits > 1) {
    const cudaError_t e =
        cudaMemsetAsync(args.out, 0, sizeof(float) * s.rows() * uint64_t{s.heads} * s.d_v, stream);
    if (e != cudaSuccess) {
      return std::string("HstuAttention (bf16): cudaMemsetAsync: ") + cudaGetErrorString(e);
    }
  }
  (void)cudaGetLastError();  // clear an earlier, unrelated error of this thread
  const dim3 grid((s.rows() + kRows - 1) / kRows, s.heads, splits);
  kernel<<<grid, kThreads, smem, stream>>>(args, 1.0f / sqrtf(static_cast<float>(s.d_qk)),
                                           1.0f / s.attn_norm);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return std::string("HstuAttention (bf16): launch: ") + cudaGetErrorString(e);
  return "";
}

}  // namespace

std::string LaunchHstuAttentionBf16(const HstuAttentionArgs& args, void* stream) {
  if (const char* why = HstuAttentionArgsError(args); why[0] != '\0') {
    return std::string("HstuAttention (bf16): ") + why;
  }
  if (!HstuAttentionBf16Supports(args)) {
    return "HstuAttention (bf16): needs d_qk = d_v of 64 or 128 and 16-byte aligned K/V vectors";
  }
  if (args.shape.rows() == 0) return "";
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return args.shape.d_qk == 128 ? Launch<128>(args, st) : Launch<64>(args, st);
}

}  // namespace hlem::cuda
