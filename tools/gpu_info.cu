// hlem_gpu_info: lists the CUDA devices this process sees (name, compute capability, memory,
// SMs) and checks that a kernel runs on each. Needs only the CUDA toolkit, so it builds and runs
// on a bare GPU host. Exit codes: 0 = at least one device ran the kernel, 3 = no CUDA device,
// 1 = a device failed.
#include <cuda_runtime.h>

#include <cstdio>

namespace {

__global__ void Fill(int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * 3 + 1;
}

bool RunKernel(int device) {
  constexpr int kN = 1 << 16;
  int* d = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&d, kN * sizeof(int)) != cudaSuccess) {
    return false;
  }
  Fill<<<(kN + 255) / 256, 256>>>(d, kN);
  static int host[kN];
  bool ok = cudaMemcpy(host, d, sizeof(host), cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(d);
  for (int i = 0; ok && i < kN; ++i) ok = host[i] == i * 3 + 1;
  return ok;
}

}  // namespace

int main() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("no CUDA device (%s)\n", err == cudaSuccess ? "count 0" : cudaGetErrorString(err));
    return 3;
  }
  int failed = 0;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, i);
    bool ok = RunKernel(i);
    failed += ok ? 0 : 1;
    std::printf("device %d: %s sm_%d%d, %.1f GiB, %d SMs, kernel %s\n", i, p.name, p.major, p.minor,
                p.totalGlobalMem / 1073741824.0, p.multiProcessorCount, ok ? "ok" : "FAILED");
  }
  return failed == 0 ? 0 : 1;
}
