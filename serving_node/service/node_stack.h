#pragma once
// Everything one serving node is made of, built from its NodeConfig: the HSTU model and the parts
// of serving_node/device/local_node.h. Used by the serving_node binary, the integration tests and
// the node benchmark; the row source (normally the shard client) is borrowed.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serving_node/core/row_source.h"
#include "serving_node/device/local_node.h"
#include "serving_node/model/hstu_model.h"
#include "serving_node/service/node_config.h"

namespace hlem::serving {

// The node's parts (LocalNode) plus its HSTU model, built from the config.
struct NodeStack : LocalNode {
  // `epoch` is the node's incarnation (strictly increasing across restarts). Errors name the
  // config field (e.g. a weights file that does not match model.*). Nothing is started: call
  // Start(). `background_clock` runs the refiller and the memory manager (null: `clock`;
  // LocalNodeOptions::background_clock).
  static absl::StatusOr<std::unique_ptr<NodeStack>> Build(const NodeConfig& config,
                                                          RowSource& source, uint64_t epoch,
                                                          Clock& clock,
                                                          Clock* background_clock = nullptr);

  NodeConfig config;
  std::vector<FeatureSpec> features;
  // The libtorch model, owned as owned_runner; nullptr on the cuda device (memory.device: cuda),
  // whose runner (CudaModelRunner, the same weights) is owned_runner.
  HstuModel* model = nullptr;
};

// Process settings for the model's CPU compute; call first thing in main(), before any thread
// starts. (1) glibc malloc keeps freed memory (mmap threshold 256 MiB, trim threshold 1 GiB): the
// model's per-request temporaries of a few MiB were otherwise returned to the OS and faulted in
// again on every request (the cold 512-token forward took 2× as long). (2) When OpenBLAS fell back
// to its generic "Prescott" kernels because it did not recognise the CPU (virtual machines
// reporting a generic model) while the CPU has AVX-512 or AVX2, sets OPENBLAS_CORETYPE to
// SkylakeX or Haswell and re-executes the process (OpenBLAS picks its kernels when it loads, before
// main). Returns a line for the log saying what was done.
std::string TuneComputeProcess(char** argv);

// The process-wide compute threads of the model (torch intra-op; OMP_NUM_THREADS and
// OMP_WAIT_POLICY=PASSIVE are set when absent, so call it before the first torch operation).
void SetComputeThreads(uint32_t threads);

}  // namespace hlem::serving
