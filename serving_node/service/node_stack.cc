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
#include "torch/torch.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<NodeStack>> NodeStack::Build(const NodeConfig& config,
                                                            RowSource& source, uint64_t epoch,
                                                            Clock& clock) {
  auto s = std::make_unique<NodeStack>();
  s->config = config;
  ASSIGN_OR_RETURN(LocalNodeOptions options, ResolveLocalNodeOptions(config));
  s->features = options.pipeline.features;
  std::unique_ptr<HstuModel> model;
  if (config.weights.empty()) {
    ASSIGN_OR_RETURN(model, HstuModel::CreateRandom(config.model, config.model_seed));
  } else {
    ASSIGN_OR_RETURN(model, HstuModel::Load(config.model, config.weights));
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
