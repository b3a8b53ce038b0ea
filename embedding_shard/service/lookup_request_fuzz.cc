// Fuzz target: Lookup requests as they arrive on the wire (serialized LookupRequest), through the
// real service implementation over a small store.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/metrics.h"
#include "embedding_shard/core/shard_store.h"
#include "embedding_shard/service/shard_service.h"

namespace {

struct Fixture {
  Fixture() {
    hlem::shard::ShardStoreOptions o;
    o.tables = {
        {.id = 0, .name = "item", .rows = 1000, .dim = 8, .dtype = hlem::shard::Dtype::kFp32},
        {.id = 3, .name = "cat", .rows = 10, .dim = 4, .dtype = hlem::shard::Dtype::kBf16}};
    o.map = {.num_shards = 2, .partitioning = hlem::shard::Partitioning::kHash, .replicas = 1};
    o.max_batch_rows = 512;
    store = *hlem::shard::ShardStore::Create(o, heap);
    metrics = std::make_unique<hlem::shard::ShardMetrics>(registry);
    service = std::make_unique<hlem::shard::ShardServiceImpl>(*store, nullptr, 1, *metrics);
  }
  hlem::shard::HeapAllocator heap;
  std::unique_ptr<hlem::shard::ShardStore> store;
  hlem::MetricsRegistry registry;
  std::unique_ptr<hlem::shard::ShardMetrics> metrics;
  std::unique_ptr<hlem::shard::ShardServiceImpl> service;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* f = new Fixture();
  hlem::v1::LookupRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  hlem::v1::LookupResponse response;
  grpc::ServerContext context;
  grpc::Status status = f->service->Lookup(&context, &request, &response);
  const size_t row_bytes = request.table_id() == 0 ? 32 : 8;
  if (status.ok() && response.rows().size() != request.row_ids_size() * row_bytes) {
    __builtin_trap();
  }
  if (!status.ok() && status.error_message().empty()) __builtin_trap();
  return 0;
}
