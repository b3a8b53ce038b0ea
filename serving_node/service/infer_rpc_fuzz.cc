// Fuzz target: Infer requests as they arrive on the wire (serialized InferRequest), through the
// node's RPC handler, node, queue, pipeline, caches and cpu device, with generated rows and the
// pipeline tests' torch-free model (pipeline_testing.h: its scores read every cached K). The
// libtorch twin of this target (infer_request_fuzz) runs the HSTU but cannot be built by clang's
// libFuzzer here; this one can (the fuzz-services preset). Every input must get an answer (OK
// with a score per candidate and target, or a status), never a crash or a hang.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/clock.h"
#include "serving_node/core/pipeline_testing.h"
#include "serving_node/device/local_node.h"
#include "serving_node/service/infer_fuzzing.h"
#include "serving_node/service/node_config.h"
#include "serving_node/service/node_service.h"

namespace {

using namespace hlem::serving;  // NOLINT
namespace fake = hlem::serving::testing;
static_assert(fake::kDim == 8, "SmallNodeConfig's tables and model are 8-dim");

struct Fixture {
  Fixture() {
    absl::StatusOr<LocalNodeOptions> options =
        ResolveLocalNodeOptions(fuzzing::SmallNodeConfig(runner.targets()));
    if (!options.ok()) __builtin_trap();
    absl::StatusOr<std::unique_ptr<LocalNode>> built =
        LocalNode::Build(*options, rows, runner, /*epoch=*/1, clock);
    if (!built.ok()) __builtin_trap();
    node = std::move(*built);
    node->Start();
    service = std::make_unique<ServingNodeServiceImpl>(*node->node, NodeDescription{});
  }
  hlem::RealClock clock;
  fake::FakeRowSource rows;
  fake::FakeRunner runner;
  std::unique_ptr<LocalNode> node;
  std::unique_ptr<ServingNodeServiceImpl> service;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture();
  return fuzzing::FuzzInfer(*fixture->service, fixture->runner.targets(), data, size);
}
