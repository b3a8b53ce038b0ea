#include "serving_node/service/node_stack.h"

#include <dlfcn.h>
#include <malloc.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#ifdef HLEM_HAVE_CUDA
#include "serving_node/device/cuda_device.h"
#include "serving_node/device/cuda_model_runner.h"
#endif
#include "torch/torch.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<NodeStack>> NodeStack::Build(const NodeConfig& config,
                                                            RowSource& source, uint64_t epoch,
                                                            Clock& clock, Clock* background_clock) {
  auto s = std::make_unique<NodeStack>();
  s->config = config;
  ASSIGN_OR_RETURN(LocalNodeOptions options, ResolveLocalNodeOptions(config));
  options.background_clock = background_clock;
  s->features = options.pipeline.features;
  std::unique_ptr<HstuModel> model;
  if (config.weights.empty()) {
    ASSIGN_OR_RETURN(model, HstuModel::CreateRandom(config.model, config.model_seed));
  } else {
    ASSIGN_OR_RETURN(model, HstuModel::Load(config.model, config.weights));
  }
  if (config.device == "cuda") {
#ifdef HLEM_HAVE_CUDA
    // The same weights (file or seed) as a cpu node's, uploaded to the GPU; the pool is
    // cudaMalloc'd on the same device. The torch model is not kept.
    const int ordinal = static_cast<int>(config.cuda_device);
    const cuda::HstuAttentionMath math = config.cuda_attention == "fp32"
                                             ? cuda::HstuAttentionMath::kFp32
                                             : cuda::HstuAttentionMath::kBf16;
    auto runner = CudaModelRunner::Create(
        model->Flatten(), ordinal, {.attention = math, .tf32_gemm = config.cuda_gemm == "tf32"});
    if (!runner.ok()) {
      return absl::Status(runner.status().code(),
                          absl::StrCat("memory.device: cuda: ", runner.status().message()));
    }
    options.make_device = [ordinal](uint64_t pool_bytes) -> absl::StatusOr<PoolDevice> {
      auto device = CudaDevice::Create({.pool_bytes = pool_bytes, .device = ordinal});
      if (!device.ok()) {
        return absl::Status(device.status().code(),
                            absl::StrCat("memory.device: cuda: ", device.status().message()));
      }
      std::byte* pool = (*device)->cuda_pool().pool();
      return PoolDevice{.device = std::move(*device), .runner_pool = pool};
    };
    s->owned_runner = std::move(*runner);
    RETURN_IF_ERROR(s->Assemble(options, source, *s->owned_runner, epoch, clock));
    return s;
#else
    return absl::UnavailableError(
        "memory.device: cuda: this build has no CUDA support (nvcc was not found when it was "
        "configured; see docs/build.md)");
#endif
  }
  s->model = model.get();
  s->owned_runner = std::move(model);
  RETURN_IF_ERROR(s->Assemble(options, source, *s->model, epoch, clock));
  return s;
}

std::string TuneComputeProcess(char** argv) {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  using CoreName = char* (*)();
  const auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (corename == nullptr) return "openblas not loaded";
  const std::string core = corename();
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced != nullptr) {
    return absl::StrCat("openblas core ", core, " (OPENBLAS_CORETYPE=", forced, ")");
  }
  if (strcasecmp(core.c_str(), "prescott") != 0) return absl::StrCat("openblas core ", core);
  __builtin_cpu_init();
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    better = "Haswell";
  }
  if (better == nullptr || argv == nullptr) return absl::StrCat("openblas core ", core);
  setenv("OPENBLAS_CORETYPE", better, /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  // exec failed: carry on with the generic kernels.
  return absl::StrCat("openblas core ", core, " (re-exec with ", better, " failed)");
}

void SetComputeThreads(uint32_t threads) {
  const std::string n = std::to_string(threads);
  setenv("OMP_NUM_THREADS", n.c_str(), /*overwrite=*/0);
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
  at::set_num_threads(static_cast<int>(threads));
  try {
    at::set_num_interop_threads(1);
  } catch (const std::exception&) {
    // Only possible before the first inter-op work; later calls keep what is set.
  }
}

}  // namespace hlem::serving
