#include "embedding_shard/service/shard_service.h"

#include <chrono>

#include "common/grpc_status.h"

namespace hlem::shard {

hlem::v1::Dtype ToProto(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp32:
      return hlem::v1::DTYPE_FP32;
    case Dtype::kFp16:
      return hlem::v1::DTYPE_FP16;
    case Dtype::kBf16:
      return hlem::v1::DTYPE_BF16;
  }
  return hlem::v1::DTYPE_UNSPECIFIED;
}

std::optional<Dtype> FromProto(hlem::v1::Dtype dtype) {
  switch (dtype) {
    case hlem::v1::DTYPE_FP32:
      return Dtype::kFp32;
    case hlem::v1::DTYPE_FP16:
      return Dtype::kFp16;
    case hlem::v1::DTYPE_BF16:
      return Dtype::kBf16;
    default:
      return std::nullopt;
  }
}

grpc::Status ShardServiceImpl::Lookup(grpc::ServerContext* /*context*/,
                                      const hlem::v1::LookupRequest* request,
                                      hlem::v1::LookupResponse* response) {
  auto start = std::chrono::steady_clock::now();
  std::span<const uint64_t> rows(request->row_ids().data(), request->row_ids().size());
  const TableSpec* spec = store_.FindTable(request->table_id());
  absl::Status status;
  if (spec == nullptr || rows.empty() || rows.size() > store_.options().max_batch_rows) {
    status = store_.ValidateBatch(request->table_id(), rows);  // the precise error
  } else {
    // The batch size is bounded now: gather straight into the response's bytes field.
    std::string* out = response->mutable_rows();
    out->resize(rows.size() * spec->row_bytes());
    status =
        store_.Gather(request->table_id(), rows,
                      std::span<std::byte>(reinterpret_cast<std::byte*>(out->data()), out->size()));
    response->set_row_bytes(static_cast<uint32_t>(spec->row_bytes()));
    response->set_dtype(ToProto(spec->dtype));
    response->set_dim(spec->dim);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics_.Observe(ServeTransport::kGrpc, rows.size(), response->rows().size(), seconds,
                   status.code());
  if (!status.ok()) response->Clear();
  return ToGrpcStatus(status);
}

grpc::Status ShardServiceImpl::GetShardInfo(grpc::ServerContext* /*context*/,
                                            const hlem::v1::GetShardInfoRequest* /*request*/,
                                            hlem::v1::ShardInfo* response) {
  const ShardStoreOptions& o = store_.options();
  response->set_shard_index(o.server_index);
  response->set_num_shards(o.map.num_shards);
  response->set_partition(std::string(PartitioningName(o.map.partitioning)));
  response->set_replicas(o.map.replicas);
  response->set_incarnation(incarnation_);
  response->set_max_batch_rows(o.max_batch_rows);
  response->set_content(o.content.kind == ContentSource::Kind::kFile ? "file" : "generated");
  response->set_content_seed(o.content.seed);
  for (const TableSpec& spec : o.tables) {
    hlem::v1::TableInfo* t = response->add_tables();
    t->set_table_id(spec.id);
    t->set_name(spec.name);
    t->set_rows(spec.rows);
    t->set_dim(spec.dim);
    t->set_dtype(ToProto(spec.dtype));
    t->set_row_bytes(static_cast<uint32_t>(spec.row_bytes()));
    for (const Segment& s : store_.segments()) {
      if (s.table_id != spec.id) continue;
      hlem::v1::RowSegment* seg = t->add_segments();
      seg->set_partition(s.partition);
      seg->set_first_slot(s.slots.first);
      seg->set_num_slots(s.slots.count);
    }
  }
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::GetRdmaInfo(grpc::ServerContext* /*context*/,
                                           const hlem::v1::GetRdmaInfoRequest* /*request*/,
                                           hlem::v1::RdmaInfo* response) {
  if (rdma_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the UCX data plane is disabled on this shard (ucx.enabled: false)");
  }
  response->set_worker_address(rdma_->worker_address);
  for (const std::string& t : rdma_->transports) response->add_transports(t);
  response->set_gather_am_id(kGatherRequestAm);
  response->set_incarnation(incarnation_);
  response->set_host_id(rdma_->host_id);
  for (const RdmaRegionInfo& r : rdma_->regions) {
    hlem::v1::RdmaRegion* out = response->add_regions();
    out->set_table_id(r.table_id);
    out->set_partition(r.partition);
    out->set_base_address(r.base_address);
    out->set_rkey(r.rkey);
    out->set_stride_bytes(r.stride_bytes);
    out->set_first_slot(r.first_slot);
    out->set_num_slots(r.num_slots);
  }
  return grpc::Status::OK;
}

}  // namespace hlem::shard
