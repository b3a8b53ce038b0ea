#include "serving_node/device/cuda/hstu_runner.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "serving_node/device/cuda/hstu_attention.h"

namespace hlem::cuda {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(uint64_t elements) {
  return static_cast<unsigned>(std::min<uint64_t>((elements + kThreads - 1) / kThreads, 1u << 16));
}

#define HLEM_GRID_STRIDE(i, n)                                                \
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < (n); \
       i += uint64_t{gridDim.x} * blockDim.x)

__device__ float Silu(float x) { return x / (1.0f + expf(-x)); }

// x[r] = √D · emb[r] + pos[pos_row[r]]
__global__ void InputsKernel(const float* emb, const uint32_t* pos_row, const float* pos,
                             uint64_t rows, uint32_t dim, float scale, float* x) {
  HLEM_GRID_STRIDE(i, rows * dim) {
    x[i] = scale * emb[i] + pos[uint64_t{pos_row[i / dim]} * dim + i % dim];
  }
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), in every thread.
__device__ float BlockSum(float v, float* partial) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // an earlier call's readers are done with `partial`
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) total += partial[w];
  return total;
}

// One block per row: out[r] = LN(in[r]) · γ + β (ε = 1e-5, biased variance as torch), times
// mul[r] when `mul` is given (U ⊙ LN(A)).
__global__ void LayerNormKernel(const float* in, uint32_t width, const float* gamma,
                                const float* beta, const float* mul, float* out) {
  __shared__ float partial[32];
  const uint64_t base = uint64_t{blockIdx.x} * width;
  float s = 0;
  for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) s += in[base + i];
  const float mean = BlockSum(s, partial) / width;
  float q = 0;
  for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float d = in[base + i] - mean;
    q += d * d;
  }
  const float inv = rsqrtf(BlockSum(q, partial) / width + 1e-5f);
  for (uint32_t i = threadIdx.x; i < width; i += blockDim.x) {
    float v = (in[base + i] - mean) * inv * gamma[i] + beta[i];
    if (mul != nullptr) v *= mul[base + i];
    out[base + i] = v;
  }
}

// SiLU(raw + bias), split by column into U, V, Q, K (each row-major, contiguous per token).
__global__ void BiasSiluSplitKernel(const float* raw, const float* bias, uint64_t rows, uint32_t hv,
                                    uint32_t hq, float* u, float* v, float* q, float* k) {
  const uint64_t width = 2 * uint64_t{hv} + 2 * hq;
  HLEM_GRID_STRIDE(i, rows * width) {
    const uint64_t r = i / width, c = i % width;
    const float val = Silu(raw[i] + bias[c]);
    if (c < hv) {
      u[r * hv + c] = val;
    } else if (c < 2 * hv) {
      v[r * hv + c - hv] = val;
    } else if (c < 2 * hv + hq) {
      q[r * hq + c - 2 * hv] = val;
    } else {
      k[r * hq + c - 2 * hv - hq] = val;
    }
  }
}

// The K/V of one request's new history tokens (global positions cached .. cached + fresh - 1)
// into their page slots, padded with zeros to kv_dim (as the CPU runner writes them).
__global__ void AppendKvKernel(const float* k, const float* v, uint32_t fresh, uint32_t cached,
                               uint32_t hq, uint32_t hv, const uint64_t* pages,
                               serving::KvGeometry g, uint32_t layer, std::byte* pool) {
  HLEM_GRID_STRIDE(i, uint64_t{fresh} * g.kv_dim) {
    const uint64_t t = i / g.kv_dim;
    const uint32_t e = static_cast<uint32_t>(i % g.kv_dim);
    const uint32_t token = cached + static_cast<uint32_t>(t), slot = token % g.page_tokens;
    std::byte* page = pool + pages[token / g.page_tokens];
    reinterpret_cast<float*>(page + g.OffsetInPage(layer, serving::KvPart::kKey, slot))[e] =
        e < hq ? k[t * hq + e] : 0.0f;
    reinterpret_cast<float*>(page + g.OffsetInPage(layer, serving::KvPart::kValue, slot))[e] =
        e < hv ? v[t * hv + e] : 0.0f;
  }
}

__global__ void GatherRowsKernel(const float* in, const uint32_t* rows, uint64_t count,
                                 uint32_t width, float* out) {
  HLEM_GRID_STRIDE(i, count * width) { out[i] = in[uint64_t{rows[i / width]} * width + i % width]; }
}

__global__ void BiasKernel(float* x, const float* bias, uint64_t rows, uint32_t width, bool silu) {
  HLEM_GRID_STRIDE(i, rows * width) {
    const float v = x[i] + bias[i % width];
    x[i] = silu ? Silu(v) : v;
  }
}

// Grow-only device or pinned host memory.
template <bool kPinned>
struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
  ~Buffer() { Release(); }
  void Release() {
    if (p != nullptr) kPinned ? cudaFreeHost(p) : cudaFree(p);
    p = nullptr;
    bytes = 0;
  }
  cudaError_t Reserve(size_t want) {
    if (want <= bytes) return cudaSuccess;
    Release();
    const cudaError_t e = kPinned ? cudaMallocHost(&p, want) : cudaMalloc(&p, want);
    if (e == cudaSuccess) bytes = want;
    return e;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct DeviceLayer {
  const float *ln1_w, *ln1_b, *w_uvqk, *b_uvqk, *ln2_w, *ln2_b, *w_o;
};

std::string CudaError(const char* what, cudaError_t e) {
  return std::string("CudaHstuRunner: ") + what + ": " + cudaGetErrorString(e);
}

}  // namespace

struct CudaHstuRunner::Impl {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::vector<void*> owned;  // the weights
  const float* pos = nullptr;
  std::vector<DeviceLayer> layers;
  const float *head_w1 = nullptr, *head_b1 = nullptr, *head_w2 = nullptr, *head_b2 = nullptr;
  // The batch's workspace.
  Buffer<false> emb, pos_row, pages, cand_rows, x, xn, raw, u, v, q, k, a, g, cand, hidden, out;
  Buffer<true> stage_emb, stage_pos, stage_pages, stage_cand, stage_out;

  ~Impl() {
    for (void* p : owned) cudaFree(p);
    if (blas != nullptr) cublasDestroy(blas);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  std::string Upload(const std::vector<float>& host, const float** device) {
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, std::max<size_t>(4, host.size() * 4)); e != cudaSuccess) {
      return CudaError("cudaMalloc (weights)", e);
    }
    owned.push_back(p);
    if (cudaError_t e = cudaMemcpy(p, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
        e != cudaSuccess) {
      return CudaError("cudaMemcpy (weights)", e);
    }
    *device = static_cast<const float*>(p);
    return "";
  }

  // C[M×N] = A[M×K] · B[K×N] + beta · C, all row-major (cuBLAS sees the transposes).
  std::string Gemm(uint64_t M, uint64_t N, uint64_t K, const float* A, const float* B, float* C,
                   float beta) {
    const float alpha = 1;
    const cublasStatus_t st =
        cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                    static_cast<int>(K), &alpha, B, static_cast<int>(N), A, static_cast<int>(K),
                    &beta, C, static_cast<int>(N));
    return st == CUBLAS_STATUS_SUCCESS
               ? ""
               : "CudaHstuRunner: cublasSgemm failed (status " + std::to_string(st) + ")";
  }
};

CudaHstuRunner::CudaHstuRunner(const serving::HstuFlatShape& shape,
                               const CudaHstuRunnerOptions& options, std::unique_ptr<Impl> impl)
    : shape_(shape), options_(options), impl_(std::move(impl)) {}
CudaHstuRunner::~CudaHstuRunner() = default;

std::unique_ptr<CudaHstuRunner> CudaHstuRunner::Create(const serving::HstuFlatWeights& w,
                                                       std::string* error,
                                                       const CudaHstuRunnerOptions& options) {
  if (std::string e = w.Error(); !e.empty()) {
    *error = "CudaHstuRunner: weights: " + e;
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  if (cudaError_t e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    *error = CudaError("cudaStreamCreate", e);
    return nullptr;
  }
  if (cublasCreate(&impl->blas) != CUBLAS_STATUS_SUCCESS ||
      cublasSetStream(impl->blas, impl->stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetMathMode(impl->blas,
                        options.tf32_gemm ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) !=
          CUBLAS_STATUS_SUCCESS) {
    impl->blas = nullptr;
    *error = "CudaHstuRunner: cannot create a cuBLAS handle";
    return nullptr;
  }
  std::string e = impl->Upload(w.pos, &impl->pos);
  for (const serving::HstuFlatLayer& L : w.layers) {
    DeviceLayer d{};
    for (auto [host, device] : {std::pair{&L.ln1_w, &d.ln1_w}, std::pair{&L.ln1_b, &d.ln1_b},
                                std::pair{&L.w_uvqk, &d.w_uvqk}, std::pair{&L.b_uvqk, &d.b_uvqk},
                                std::pair{&L.ln2_w, &d.ln2_w}, std::pair{&L.ln2_b, &d.ln2_b},
                                std::pair{&L.w_o, &d.w_o}}) {
      if (e.empty()) e = impl->Upload(*host, device);
    }
    impl->layers.push_back(d);
  }
  for (auto [host, device] :
       {std::pair{&w.head_w1, &impl->head_w1}, std::pair{&w.head_b1, &impl->head_b1},
        std::pair{&w.head_w2, &impl->head_w2}, std::pair{&w.head_b2, &impl->head_b2}}) {
    if (e.empty()) e = impl->Upload(*host, device);
  }
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  return std::unique_ptr<CudaHstuRunner>(new CudaHstuRunner(w.shape, options, std::move(impl)));
}

std::string CudaHstuRunner::Run(const CudaHstuStep* steps, size_t count) {
  const serving::HstuFlatShape& s = shape_;
  struct Plan {
    uint64_t first_row, first_page, pages;
  };
  std::vector<Plan> plans(count);
  uint64_t rows = 0, cands = 0, pages = 0;
  for (size_t i = 0; i < count; ++i) {
    const CudaHstuStep& st = steps[i];
    if (std::string e = CudaHstuStepError(s, st); !e.empty()) {
      return "step " + std::to_string(i) + ": " + e;
    }
    const uint64_t total = uint64_t{st.cached} + st.fresh;
    plans[i] = {rows, pages, (total + st.geometry.page_tokens - 1) / st.geometry.page_tokens};
    rows += st.fresh + st.candidates;
    cands += st.candidates;
    pages += plans[i].pages;
  }
  if (count == 0) return "";
  Impl& m = *impl_;
  const uint64_t D = s.dim, U = s.uvqk(), hv = s.hv(), hq = s.hq(), h = s.head_hidden,
                 T = s.targets;
  const std::pair<Buffer<false>*, uint64_t> device_sizes[] = {
      {&m.emb, rows * D * 4},
      {&m.pos_row, rows * 4},
      {&m.pages, std::max<uint64_t>(1, pages) * 8},
      {&m.cand_rows, cands * 4},
      {&m.x, rows * D * 4},
      {&m.xn, rows * D * 4},
      {&m.raw, rows * U * 4},
      {&m.u, rows * hv * 4},
      {&m.v, rows * hv * 4},
      {&m.q, rows * hq * 4},
      {&m.k, rows * hq * 4},
      {&m.a, rows * hv * 4},
      {&m.g, rows * hv * 4},
      {&m.cand, cands * D * 4},
      {&m.hidden, cands * h * 4},
      {&m.out, cands * T * 4}};
  for (const auto& [buffer, bytes] : device_sizes) {
    if (cudaError_t e = buffer->Reserve(bytes); e != cudaSuccess) return CudaError("cudaMalloc", e);
  }
  const std::pair<Buffer<true>*, uint64_t> host_sizes[] = {
      {&m.stage_emb, rows * D * 4},
      {&m.stage_pos, rows * 4},
      {&m.stage_pages, std::max<uint64_t>(1, pages) * 8},
      {&m.stage_cand, cands * 4},
      {&m.stage_out, cands * T * 4}};
  for (const auto& [buffer, bytes] : host_sizes) {
    if (cudaError_t e = buffer->Reserve(bytes); e != cudaSuccess) {
      return CudaError("cudaMallocHost", e);
    }
  }
  // Stage the batch: each step's rows are its new history tokens, then its candidates.
  float* emb = m.stage_emb.as<float>();
  uint32_t* pos_row = m.stage_pos.as<uint32_t>();
  uint32_t* cand_rows = m.stage_cand.as<uint32_t>();
  uint64_t* page_table = m.stage_pages.as<uint64_t>();
  bool host_emb = false;  // some step's inputs are in host memory (staged, uploaded below)
  for (size_t i = 0, c = 0; i < count; ++i) {
    const CudaHstuStep& st = steps[i];
    const Plan& p = plans[i];
    const uint32_t total = st.cached + st.fresh;
    if (!st.emb_on_device) {
      host_emb = true;
      if (st.fresh > 0) {
        std::memcpy(emb + p.first_row * D, st.new_history_emb, uint64_t{st.fresh} * D * 4);
      }
      std::memcpy(emb + (p.first_row + st.fresh) * D, st.candidate_emb,
                  uint64_t{st.candidates} * D * 4);
    }
    for (uint32_t t = 0; t < st.fresh; ++t) pos_row[p.first_row + t] = st.cached + t;
    for (uint32_t r = 0; r < st.candidates; ++r) {
      pos_row[p.first_row + st.fresh + r] = total;
      cand_rows[c++] = static_cast<uint32_t>(p.first_row + st.fresh + r);
    }
    if (p.pages > 0) std::memcpy(page_table + p.first_page, st.page_offsets, p.pages * 8);
  }
  cudaStream_t stream = m.stream;
  const std::tuple<void*, const void*, uint64_t> copies[] = {
      {m.emb.p, m.stage_emb.p, host_emb ? rows * D * 4 : 0},
      {m.pos_row.p, m.stage_pos.p, rows * 4},
      {m.pages.p, m.stage_pages.p, pages * 8},
      {m.cand_rows.p, m.stage_cand.p, cands * 4}};
  for (const auto& [dst, src, bytes] : copies) {
    if (bytes == 0) continue;
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
        e != cudaSuccess) {
      return CudaError("cudaMemcpyAsync (inputs)", e);
    }
  }
  // Inputs already on the device (after the upload above, which they overwrite in stream order).
  for (size_t i = 0; i < count; ++i) {
    const CudaHstuStep& st = steps[i];
    if (!st.emb_on_device) continue;
    float* dst = m.emb.as<float>() + plans[i].first_row * D;
    const std::pair<const float*, uint64_t> parts[] = {{st.new_history_emb, st.fresh},
                                                       {st.candidate_emb, st.candidates}};
    for (const auto& [src, n] : parts) {
      if (n == 0) continue;
      if (cudaError_t e = cudaMemcpyAsync(dst, src, n * D * 4, cudaMemcpyDeviceToDevice, stream);
          e != cudaSuccess) {
        return CudaError("cudaMemcpyAsync (device inputs)", e);
      }
      dst += n * D;
    }
  }
  (void)cudaGetLastError();  // clear an earlier, unrelated error of this thread
  float *x = m.x.as<float>(), *xn = m.xn.as<float>(), *raw = m.raw.as<float>();
  float *u = m.u.as<float>(), *v = m.v.as<float>(), *q = m.q.as<float>(), *k = m.k.as<float>();
  float *a = m.a.as<float>(), *g = m.g.as<float>();
  InputsKernel<<<GridFor(rows * D), kThreads, 0, stream>>>(
      m.emb.as<float>(), m.pos_row.as<uint32_t>(), m.pos, rows, s.dim,
      std::sqrt(static_cast<float>(s.dim)), x);
  for (uint32_t l = 0; l < s.layers; ++l) {
    const DeviceLayer& L = m.layers[l];
    LayerNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, s.dim, L.ln1_w,
                                                                          L.ln1_b, nullptr, xn);
    if (std::string e = m.Gemm(rows, U, D, xn, L.w_uvqk, raw, 0); !e.empty()) return e;
    BiasSiluSplitKernel<<<GridFor(rows * U), kThreads, 0, stream>>>(
        raw, L.b_uvqk, rows, static_cast<uint32_t>(hv), static_cast<uint32_t>(hq), u, v, q, k);
    for (size_t i = 0; i < count; ++i) {
      const CudaHstuStep& st = steps[i];
      const Plan& p = plans[i];
      const uint64_t* step_pages = m.pages.as<uint64_t>() + p.first_page;
      if (st.fresh > 0) {
        AppendKvKernel<<<GridFor(uint64_t{st.fresh} * st.geometry.kv_dim), kThreads, 0, stream>>>(
            k + p.first_row * hq, v + p.first_row * hv, st.fresh, st.cached,
            static_cast<uint32_t>(hq), static_cast<uint32_t>(hv), step_pages, st.geometry, l,
            st.pool);
      }
      const uint64_t cand_row = p.first_row + st.fresh;
      HstuAttentionArgs args;  // (nvcc compiles this file as C++17: no designated initializers)
      args.shape.heads = s.heads;
      args.shape.d_qk = s.d_qk;
      args.shape.d_v = s.d_v;
      args.shape.attn_norm = s.attn_norm;
      args.shape.cached = st.cached;
      args.shape.fresh = st.fresh;
      args.shape.candidates = st.candidates;
      args.geometry = st.geometry;
      args.layer = l;
      args.pool = st.pool;
      args.page_offsets = step_pages;
      args.q = q + p.first_row * hq;
      args.cand_k = k + cand_row * hq;
      args.cand_v = v + cand_row * hv;
      args.out = a + p.first_row * hv;
      if (std::string e = LaunchHstuAttention(args, stream, options_.attention); !e.empty()) {
        return "step " + std::to_string(i) + ": " + e;
      }
    }
    LayerNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        a, static_cast<uint32_t>(hv), L.ln2_w, L.ln2_b, u, g);
    if (std::string e = m.Gemm(rows, D, hv, g, L.w_o, x, 1); !e.empty()) return e;  // residual
  }
  float *cand = m.cand.as<float>(), *hidden = m.hidden.as<float>(), *out = m.out.as<float>();
  GatherRowsKernel<<<GridFor(cands * D), kThreads, 0, stream>>>(x, m.cand_rows.as<uint32_t>(),
                                                                cands, s.dim, cand);
  if (std::string e = m.Gemm(cands, h, D, cand, m.head_w1, hidden, 0); !e.empty()) return e;
  BiasKernel<<<GridFor(cands * h), kThreads, 0, stream>>>(hidden, m.head_b1, cands, s.head_hidden,
                                                          true);
  if (std::string e = m.Gemm(cands, T, h, hidden, m.head_w2, out, 0); !e.empty()) return e;
  BiasKernel<<<GridFor(cands * T), kThreads, 0, stream>>>(out, m.head_b2, cands, s.targets, false);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return CudaError("launch", e);
  if (cudaError_t e =
          cudaMemcpyAsync(m.stage_out.p, out, cands * T * 4, cudaMemcpyDeviceToHost, stream);
      e != cudaSuccess) {
    return CudaError("cudaMemcpyAsync (scores)", e);
  }
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    return CudaError("cudaStreamSynchronize", e);
  }
  const float* scores = m.stage_out.as<float>();
  for (size_t i = 0; i < count; ++i) {
    const uint64_t n = uint64_t{steps[i].candidates} * T;
    std::memcpy(steps[i].scores, scores, n * 4);
    scores += n;
  }
  return "";
}

}  // namespace hlem::cuda
