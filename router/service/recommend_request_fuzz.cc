// Fuzz target: Recommend requests as they arrive on the wire (serialized RecommendRequest),
// through the real router service and cluster (validation, the user's shard profile, scoring and
// the choice of a node) over two nodes with no connection: a request that passes validation is
// routed and then answered UNAVAILABLE. Every input gets an answer with a message, never a crash.
// (The node's side of a request is infer_request_fuzz.)
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/clock.h"
#include "grpcpp/server_context.h"
#include "router/core/cluster.h"
#include "router/service/router_service.h"

namespace {

using namespace hlem::router;  // NOLINT

struct Fixture {
  Fixture() {
    ClusterOptions options;
    options.features = {{.table_id = 0, .residency_shard_rows = 64},
                        {.table_id = 1, .residency_shard_rows = 8}};
    options.max_nodes = 4;
    cluster = *Cluster::Create(options, clock);
    for (const char* id : {"node-0", "node-1"}) {
      const int index = *cluster->AddNode(id, id);
      hlem::serving::ResidencySnapshot snapshot;
      snapshot.epoch = 1;
      cluster->Reset(index, snapshot);
    }
    service = std::make_unique<RouterServiceImpl>(
        RouterServiceOptions{.max_candidates = 64, .max_history_events = 512}, *cluster);
  }
  hlem::RealClock clock;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<RouterServiceImpl> service;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture();
  hlem::v1::RecommendRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  grpc::ServerContext context;
  hlem::v1::RecommendResponse response;
  const grpc::Status status = fixture->service->Recommend(&context, &request, &response);
  // No node is connected: nothing can be OK, and every refusal says why.
  if (status.ok() || status.error_message().empty()) __builtin_trap();
  return 0;
}
