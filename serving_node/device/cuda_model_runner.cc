#include "serving_node/device/cuda_model_runner.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    const HstuFlatWeights& weights, int device, const cuda::CudaHstuRunnerOptions& options) {
  if (std::string e = weights.Error(); !e.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cuda model: weights: ", e));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    (void)cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("cuda model: no CUDA device ", device, " (", count, " visible)"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cuda model: cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
  }
  std::string error;
  std::unique_ptr<cuda::CudaHstuRunner> runner =
      cuda::CudaHstuRunner::Create(weights, &error, options);
  if (runner == nullptr) return absl::UnavailableError(absl::StrCat("cuda model: ", error));
  return std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(runner), device));
}

absl::Status CudaModelRunner::Run(std::span<const ModelStep> steps) {
  const HstuFlatShape& shape = shape_;
  std::vector<cuda::CudaHstuStep> cuda_steps(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const ModelStep& s = steps[i];
    const std::string where = absl::StrCat("step ", i, ": ");
    if (s.new_history_emb.size() % shape.dim != 0 || s.candidate_emb.size() % shape.dim != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "embeddings are not a whole number of rows of ", shape.dim));
    }
    const uint64_t fresh = s.new_history_emb.size() / shape.dim;
    const uint64_t candidates = s.candidate_emb.size() / shape.dim;
    if (s.cached_len + fresh > shape.max_positions) {
      return absl::OutOfRangeError(absl::StrCat(where, "history of ", s.cached_len + fresh,
                                                " tokens exceeds max_positions ",
                                                shape.max_positions));
    }
    if (s.scores.size() != candidates * shape.targets) {
      return absl::InvalidArgumentError(where + "scores: must hold candidates × targets floats");
    }
    cuda::CudaHstuStep& c = cuda_steps[i];
    c.geometry = s.kv.geometry;
    c.pool = s.kv.pool;
    c.page_offsets = s.kv.page_offsets.data();
    c.pages = s.kv.page_offsets.size();
    c.cached = static_cast<uint32_t>(s.cached_len);
    c.fresh = static_cast<uint32_t>(fresh);
    c.candidates = static_cast<uint32_t>(candidates);
    c.new_history_emb = s.new_history_emb.data();
    c.candidate_emb = s.candidate_emb.data();
    c.emb_on_device = true;  // the pipeline's SumRows output (ModelStep)
    c.scores = s.scores.data();
    if (std::string e = cuda::CudaHstuStepError(shape, c); !e.empty()) {
      return absl::InvalidArgumentError(where + e);
    }
  }
  absl::MutexLock lock(&mu_);
  // The runner's stream and buffers belong to device_; a compute thread may have another current.
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cuda model: cudaSetDevice: ", cudaGetErrorString(e)));
  }
  if (std::string e = runner_->Run(cuda_steps.data(), cuda_steps.size()); !e.empty()) {
    return absl::InternalError(absl::StrCat("cuda model: ", e));
  }
  return absl::OkStatus();
}

}  // namespace hlem::serving
