#include "embedding_shard/transport/ucx_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace hlem::shard {
namespace {

class UcxRegion final : public Region {
 public:
  UcxRegion(ucp_context_h context, ucp_mem_h memh, std::byte* data, size_t size)
      : context_(context), memh_(memh), data_(data), size_(size) {}
  ~UcxRegion() override { ucp_mem_unmap(context_, memh_); }
  std::byte* data() const override { return data_; }
  size_t size() const override { return size_; }
  ucp_mem_h memh() const { return memh_; }

 private:
  ucp_context_h context_;
  ucp_mem_h memh_;
  std::byte* data_;
  size_t size_;
};

// A reply buffer: header and rows in one allocation, freed when UCX completes the send.
struct ReplyBuffer {
  GatherReplyHeader header;
  std::unique_ptr<std::byte[]> bytes;  // not zero-filled: every byte is overwritten
  size_t size = 0;
  void Resize(size_t n) {
    bytes.reset(new std::byte[n]);
    size = n;
  }
  std::span<std::byte> data() { return {bytes.get(), size}; }
};

void FreeReply(void* request, ucs_status_t /*status*/, void* user_data) {
  delete static_cast<ReplyBuffer*>(user_data);
  ucp_request_free(request);
}

void SendReply(ucp_ep_h reply_ep, ReplyBuffer* reply) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = FreeReply;
  param.user_data = reply;
  ucs_status_ptr_t req =
      ucp_am_send_nbx(reply_ep, kGatherReplyAm, &reply->header, sizeof(reply->header),
                      reply->bytes.get(), reply->size, &param);
  if (req == nullptr) {
    delete reply;  // completed in place: the callback is not called
  } else if (UCS_PTR_IS_ERR(req)) {
    GetLogger("embedding_shard")
        ->warn("ucx_reply_failed status={}", UcsStatusString(UCS_PTR_STATUS(req)));
    delete reply;
  }
  // Otherwise FreeReply runs on completion (freeing the request before that would cancel it).
}

// A rendezvous request whose row ids must be received before serving.
struct RndvRequest {
  UcxShardServer* server;
  GatherRequestHeader header;
  std::vector<uint64_t> rows;
  ucp_ep_h reply_ep;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxShardServer>> UcxShardServer::Create(const UcxOptions& options) {
  std::unique_ptr<UcxShardServer> server(new UcxShardServer(options));
  auto worker = UcxWorker::Create(options, /*wakeup=*/true);
  if (!worker.ok()) return worker.status();
  server->worker_ = std::move(*worker);
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->wake_fd_ < 0) return absl::InternalError("eventfd failed");
  return server;
}

UcxShardServer::~UcxShardServer() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

absl::StatusOr<std::unique_ptr<Region>> UcxShardServer::Allocate(size_t bytes) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = std::max<size_t>(bytes, 64);
  params.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  ucs_status_t status = ucp_mem_map(worker_->context(), &params, &memh);
  if (status != UCS_OK) {
    return UcsToStatus(status, absl::StrCat("ucp_mem_map of ", bytes, " bytes"));
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  status = ucp_mem_query(memh, &attr);
  if (status != UCS_OK) {
    ucp_mem_unmap(worker_->context(), memh);
    return UcsToStatus(status, "ucp_mem_query");
  }
  return std::make_unique<UcxRegion>(worker_->context(), memh,
                                     static_cast<std::byte*>(attr.address), attr.length);
}

absl::Status UcxShardServer::Start(const ShardStore* store, GatherObserver observer) {
  store_ = store;
  observer_ = std::move(observer);
  info_.worker_address = worker_->address();
  info_.host_id = LocalHostId();
  info_.transports = worker_->Transports();
  for (const Segment& segment : store->segments()) {
    auto* region = dynamic_cast<const UcxRegion*>(segment.region.get());
    if (region == nullptr) {
      return absl::InternalError("segment memory was not allocated by the UCX server");
    }
    void* rkey = nullptr;
    size_t rkey_size = 0;
    ucs_status_t status = ucp_rkey_pack(worker_->context(), region->memh(), &rkey, &rkey_size);
    if (status != UCS_OK) return UcsToStatus(status, "ucp_rkey_pack");
    RdmaRegionInfo r;
    r.table_id = segment.table_id;
    r.partition = segment.partition;
    r.base_address = reinterpret_cast<uint64_t>(region->data());
    r.rkey.assign(static_cast<const char*>(rkey), rkey_size);
    r.stride_bytes = segment.row_bytes;
    r.first_slot = segment.slots.first;
    r.num_slots = segment.slots.count;
    ucp_rkey_buffer_release(rkey);
    info_.regions.push_back(std::move(r));
  }
  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  handler.id = kGatherRequestAm;
  handler.cb = &UcxShardServer::OnGatherRequest;
  handler.arg = this;
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  ucs_status_t status = ucp_worker_set_am_recv_handler(worker_->worker(), &handler);
  if (status != UCS_OK) return UcsToStatus(status, "ucp_worker_set_am_recv_handler");
  progress_ = std::thread([this] { ProgressLoop(); });
  GetLogger("embedding_shard")
      ->info("ucx_started transports={} regions={}", fmt::join(info_.transports, ","),
             info_.regions.size());
  return absl::OkStatus();
}

void UcxShardServer::Stop() {
  if (!progress_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  progress_.join();
}

// Busy-polls while there is traffic (and for progress_spin after it), then sleeps on the
// worker's event fd. The wait is capped at 1 ms because emulated RMA over tcp does not always
// signal the fd; a get that arrives while we sleep waits at most that long.
void UcxShardServer::ProgressLoop() {
  ucp_worker_h worker = worker_->worker();
  int efd = -1;
  if (ucp_worker_get_efd(worker, &efd) != UCS_OK) efd = -1;
  using SteadyClock = std::chrono::steady_clock;  // progress pacing only, never in core/
  auto last_active = SteadyClock::now();
  const auto spin = std::chrono::nanoseconds(absl::ToInt64Nanoseconds(options_.progress_spin));
  while (!stop_.load(std::memory_order_relaxed)) {
    if (ucp_worker_progress(worker) != 0) {
      last_active = SteadyClock::now();
      continue;
    }
    if (SteadyClock::now() - last_active < spin || efd < 0) continue;
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
    pollfd fds[2] = {{efd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    poll(fds, 2, 1);
    last_active = SteadyClock::now() - spin;  // re-arm promptly unless traffic shows up
  }
}

ucs_status_t UcxShardServer::OnGatherRequest(void* arg, const void* header, size_t header_length,
                                             void* data, size_t length,
                                             const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxShardServer*>(arg);
  if (header_length != sizeof(GatherRequestHeader) ||
      !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    return UCS_OK;  // not ours to answer: no request id or no way back
  }
  GatherRequestHeader request;
  std::memcpy(&request, header, sizeof(request));
  ucp_ep_h reply_ep = param->reply_ep;
  // The count is the client's word: check it before allocating anything from it.
  if (absl::Status st = self->store_->CheckBatchSize(request.count); !st.ok()) {
    self->SendError(request.request_id, st, reply_ep);
    return UCS_OK;
  }
  if (length != uint64_t{request.count} * sizeof(uint64_t)) {
    self->SendError(request.request_id,
                    absl::InvalidArgumentError("gather request: row id payload size mismatch"),
                    reply_ep);
    return UCS_OK;
  }
  // An exception must not unwind through UCX's C frames (std::terminate): answer instead.
  try {
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      auto* rndv = new RndvRequest{self, request, std::vector<uint64_t>(request.count), reply_ep};
      ucp_request_param_t rparam{};
      rparam.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      rparam.user_data = rndv;
      rparam.cb.recv_am = [](void* req, ucs_status_t status, size_t /*length*/, void* user) {
        auto* r = static_cast<RndvRequest*>(user);
        if (status == UCS_OK) {
          r->server->ServeGather(r->header, r->rows.data(), r->reply_ep);
        } else {
          r->server->SendError(r->header.request_id,
                               UcsToStatus(status, "gather request: receiving the row ids"),
                               r->reply_ep);
        }
        delete r;
        ucp_request_free(req);
      };
      ucs_status_ptr_t req =
          ucp_am_recv_data_nbx(self->worker_->worker(), data, rndv->rows.data(), length, &rparam);
      if (req == nullptr) {
        self->ServeGather(rndv->header, rndv->rows.data(), reply_ep);
        delete rndv;
      } else if (UCS_PTR_IS_ERR(req)) {
        self->SendError(request.request_id,
                        UcsToStatus(UCS_PTR_STATUS(req), "gather request: receiving the row ids"),
                        reply_ep);
        delete rndv;
      }
      return UCS_OK;
    }
    // Eager data may be unaligned: copy the ids out.
    std::vector<uint64_t> rows(request.count);
    if (length > 0) std::memcpy(rows.data(), data, length);
    self->ServeGather(request, rows.data(), reply_ep);
  } catch (const std::bad_alloc&) {
    self->SendError(request.request_id,
                    absl::ResourceExhaustedError("gather request: out of memory"), reply_ep);
  }
  return UCS_OK;
}

void UcxShardServer::ServeGather(const GatherRequestHeader& request, const uint64_t* rows,
                                 ucp_ep_h reply_ep) {
  auto start = std::chrono::steady_clock::now();
  const TableSpec* spec = store_->FindTable(request.table_id);
  std::span<const uint64_t> ids(rows, request.count);
  auto* reply = new ReplyBuffer();
  reply->header.request_id = request.request_id;
  absl::Status status;
  if (spec == nullptr) {
    status = store_->ValidateBatch(request.table_id, ids);  // names the unknown table
  } else {
    try {
      reply->Resize(ids.size() * spec->row_bytes());
      status = store_->Gather(request.table_id, ids, reply->data());
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError("gather request: out of memory for the reply");
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (observer_) observer_(ids.size(), reply->size, seconds, status.code());
  if (!status.ok()) {
    delete reply;
    SendError(request.request_id, status, reply_ep);
    return;
  }
  reply->header.code = 0;
  reply->header.row_bytes = static_cast<uint32_t>(spec->row_bytes());
  reply->header.count = request.count;
  SendReply(reply_ep, reply);
}

void UcxShardServer::SendError(uint64_t request_id, const absl::Status& status, ucp_ep_h reply_ep) {
  auto* reply = new ReplyBuffer();
  reply->header.request_id = request_id;
  reply->header.code = static_cast<int32_t>(status.code());
  absl::string_view msg = status.message();
  reply->Resize(msg.size());
  std::memcpy(reply->bytes.get(), msg.data(), msg.size());
  SendReply(reply_ep, reply);
}

}  // namespace hlem::shard
