// Fuzz target: Infer requests as they arrive on the wire (serialized InferRequest), through the
// real service, node, queue, pipeline and a small HSTU on the cpu device, with generated rows.
// Every input must get an answer (OK or a status), never a crash or a hang.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "common/clock.h"
#include "grpcpp/server_context.h"
#include "serving_node/core/row_source.h"
#include "serving_node/service/infer_fuzzing.h"
#include "serving_node/service/node_service.h"
#include "serving_node/service/node_stack.h"

namespace {

using namespace hlem::serving;  // NOLINT

// Rows are a function of (table, row, element).
class GeneratedRows final : public RowSource {
 public:
  absl::Status Fetch(uint32_t table_id, std::span<const uint64_t> rows, std::span<std::byte> out,
                     absl::Time) override {
    auto* f = reinterpret_cast<float*>(out.data());
    const size_t dim = out.size() / sizeof(float) / std::max<size_t>(rows.size(), 1);
    for (size_t r = 0; r < rows.size(); ++r) {
      for (size_t d = 0; d < dim; ++d) {
        f[r * dim + d] = static_cast<float>((table_id * 31 + rows[r] * 7 + d) % 17) / 17.0f - 0.5f;
      }
    }
    return absl::OkStatus();
  }
};

struct Fixture {
  Fixture() {
    SetComputeThreads(1);
    stack = *NodeStack::Build(fuzzing::SmallNodeConfig(kTargets), rows, 1, clock);
    service = std::make_unique<ServingNodeServiceImpl>(*stack->node, NodeDescription{});
  }
  static constexpr uint32_t kTargets = 2;
  hlem::RealClock clock;
  GeneratedRows rows;
  std::unique_ptr<NodeStack> stack;
  std::unique_ptr<ServingNodeServiceImpl> service;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture();
  return fuzzing::FuzzInfer(*fixture->service, Fixture::kTargets, data, size);
}
