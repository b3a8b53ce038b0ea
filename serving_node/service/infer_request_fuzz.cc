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
    NodeConfig c;
    c.pool_bytes = 64 * 4096;
    c.page_bytes = 4096;
    c.shards.tables = {{.id = 0, .name = "item", .rows = 1000, .dim = 8},
                       {.id = 5, .name = "category", .rows = 20, .dim = 8}};
    c.features = {"item", "category"};
    c.model = {.layers = 1,
               .dim = 8,
               .heads = 2,
               .d_qk = 4,
               .d_v = 4,
               .head_hidden = 8,
               .targets = 2,
               .attn_norm = 8,
               .max_positions = 128};
    c.max_history = 64;
    c.max_candidates = 16;
    c.max_request_events = 100;
    c.refill_enabled = false;
    stack = *NodeStack::Build(c, rows, 1, clock);
    service = std::make_unique<ServingNodeServiceImpl>(*stack->node, NodeDescription{});
  }
  hlem::RealClock clock;
  GeneratedRows rows;
  std::unique_ptr<NodeStack> stack;
  std::unique_ptr<ServingNodeServiceImpl> service;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture();
  hlem::v1::InferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  grpc::ServerContext context;
  hlem::v1::InferResponse response;
  const grpc::Status status = fixture->service->Infer(&context, &request, &response);
  if (status.ok() && response.scores_size() != request.candidates_size() * 2) __builtin_trap();
  return 0;
}
