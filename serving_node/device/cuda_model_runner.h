#pragma once
// The HSTU model on the `cuda` device: serving::ModelRunner over cuda::CudaHstuRunner
// (device/cuda/hstu_runner.h: our kernels + cuBLAS, fp32). Takes the weights as flat arrays
// (HstuModel::Flatten, so a GPU node serves the same model as a CPU node loading the same file or
// seed); its steps' pages live in a CudaDevice's pool (KvPagesView::pool is its device address,
// CudaPool::pool()). Checks every step first as the libtorch runner does (INVALID_ARGUMENT /
// OUT_OF_RANGE naming the step, nothing run); a CUDA failure is INTERNAL. Thread-safe: batches
// from several compute threads run one at a time on the runner's stream.

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "serving_node/core/hstu_flat.h"
#include "serving_node/core/model_runner.h"
#include "serving_node/device/cuda/hstu_runner.h"

namespace hlem::serving {

class CudaModelRunner final : public ModelRunner {
 public:
  // Uploads the weights to CUDA device `device`. INVALID_ARGUMENT for weights that do not match
  // their shape; UNAVAILABLE without the device or when CUDA fails to set up.
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(
      const HstuFlatWeights& weights, int device = 0,
      const cuda::CudaHstuRunnerOptions& options = {});

  uint32_t dim() const override { return shape_.dim; }
  uint32_t targets() const override { return shape_.targets; }
  uint32_t layers() const override { return shape_.layers; }
  uint32_t kv_dim() const override { return shape_.kv_dim(); }
  uint32_t max_positions() const override { return shape_.max_positions; }
  absl::Status Run(std::span<const ModelStep> steps) override;

 private:
  CudaModelRunner(std::unique_ptr<cuda::CudaHstuRunner> runner, int device)
      : shape_(runner->shape()), runner_(std::move(runner)), device_(device) {}
  const HstuFlatShape shape_;
  absl::Mutex mu_;
  const std::unique_ptr<cuda::CudaHstuRunner> runner_ ABSL_PT_GUARDED_BY(mu_);
  const int device_;
};

}  // namespace hlem::serving
