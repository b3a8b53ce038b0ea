#pragma once
// Everything one serving node is made of, built from its NodeConfig in dependency order and torn
// down in reverse (the node stops first, then the queue drains, then the background workers stop,
// and the pool goes last). Used by the serving_node binary, the integration tests and the node
// benchmark; the row source (normally the shard client) is borrowed.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/memory_manager.h"
#include "serving_node/core/node.h"
#include "serving_node/core/pipeline.h"
#include "serving_node/core/popularity.h"
#include "serving_node/core/refill.h"
#include "serving_node/core/request_queue.h"
#include "serving_node/core/residency_events.h"
#include "serving_node/core/residency_state.h"
#include "serving_node/core/residency_tracker.h"
#include "serving_node/core/row_source.h"
#include "serving_node/device/cpu_device.h"
#include "serving_node/model/hstu_model.h"
#include "serving_node/service/node_config.h"

namespace hlem::serving {

struct NodeStack {
  // `epoch` is the node's incarnation (strictly increasing across restarts). Errors name the
  // config field (e.g. a weights file that does not match model.*). Nothing is started: call
  // Start().
  static absl::StatusOr<std::unique_ptr<NodeStack>> Build(const NodeConfig& config,
                                                          RowSource& source, uint64_t epoch,
                                                          Clock& clock);
  ~NodeStack();
  // Starts the memory manager's steps and the node's timers.
  void Start();

  NodeConfig config;
  std::vector<FeatureSpec> features;
  std::unique_ptr<HbmPool> pool;
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<ResidencyEventLog> events;
  std::shared_ptr<ResidencyState> residency;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<EmbCache> emb;
  std::unique_ptr<MemoryManager> memory;
  std::unique_ptr<PopularitySketch> sketch;
  std::unique_ptr<Refiller> refiller;
  std::unique_ptr<ResidencyTracker> tracker;
  std::unique_ptr<HstuModel> model;
  std::unique_ptr<Pipeline> pipeline;
  std::unique_ptr<RequestQueue> queue;
  std::unique_ptr<Node> node;
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
