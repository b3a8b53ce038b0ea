#pragma once
// Fuzz targets only: the small node both Infer fuzz targets serve (infer_request_fuzz with the
// HSTU, infer_rpc_fuzz with a torch-free model) and their entry point's body.
#include <cstddef>
#include <cstdint>

#include "grpcpp/server_context.h"
#include "serving_node/service/node_config.h"
#include "serving_node/service/node_service.h"

namespace hlem::serving::fuzzing {

// Two features (item: 1 000 rows, category: 20), dim 8, a 64-page pool, `targets` scores per
// candidate, no refill.
inline NodeConfig SmallNodeConfig(uint32_t targets) {
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
             .targets = targets,
             .attn_norm = 8,
             .max_positions = 128};
  c.max_history = 64;
  c.max_candidates = 16;
  c.max_request_events = 100;
  c.refill_enabled = false;
  return c;
}

// One wire input through the service: an answer it must give (OK with `targets` scores per
// candidate, or a status); anything else traps.
inline int FuzzInfer(ServingNodeServiceImpl& service, uint32_t targets, const uint8_t* data,
                     size_t size) {
  hlem::v1::InferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  grpc::ServerContext context;
  hlem::v1::InferResponse response;
  const grpc::Status status = service.Infer(&context, &request, &response);
  if (status.ok() &&
      response.scores_size() != request.candidates_size() * static_cast<int>(targets)) {
    __builtin_trap();
  }
  return 0;
}

}  // namespace hlem::serving::fuzzing
