#include "embedding_shard/transport/ucx_client.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace hlem::shard {
namespace {

// How long a request UCX cannot complete (a close or a send to a stopped peer) is waited for
// before it is left to UCX.
constexpr absl::Duration kAbandonAfter = absl::Milliseconds(500);
// A read waiting longer than this for its answer lets the lock go now and then (Finish): answers
// normally take microseconds; a stalled shard's never come.
constexpr absl::Duration kShareLockAfter = absl::Microseconds(200);

// The connection warm-up's target and message: they must outlive its requests.
struct WarmUpBuffers {
  std::byte scratch[8];
  GatherRequestHeader header;
};

uint64_t RegionKey(uint32_t table_id, uint32_t partition) {
  return (uint64_t{table_id} << 32) | partition;
}

bool IsShm(const std::vector<std::string>& transports) {
  for (const std::string& t : transports) {
    if (t.starts_with("posix/") || t.starts_with("sysv/") || t.starts_with("xpmem/") ||
        t.starts_with("knem/") || t.starts_with("cma/")) {
      return true;
    }
  }
  return false;
}

// Whether UCX does the endpoint's one-sided reads without the server's worker: by mapping its
// memory (shared memory: posix, sysv, xpmem) or in the NIC (RDMA: rc, dc). Otherwise (tcp; ud,
// which has no RMA; cma or knem without a mapping transport, whose small gets UCX may emulate) the
// server's worker answers each get, and UCX 1.13 writes a get's reply into its destination even
// when it arrives after the endpoint was force-closed (measured over tcp: a stalled shard resumed
// after a timed-out read overwrote the caller's buffer). Such endpoints read rows with gathers
// only, whose replies are matched to ops still waited for. Unknown transports count as emulated.
bool GetsWithoutServer(const std::vector<std::string>& transports) {
  for (const std::string& t : transports) {
    for (const char* prefix :
         {"posix/", "sysv/", "xpmem/", "rc_verbs/", "rc_mlx5/", "dc_mlx5/", "rc/", "dc/"}) {
      if (t.starts_with(prefix)) return true;
    }
  }
  return false;
}

// Maps every page of a region mapped from a shard now, at connect time, so the first requests do
// not pay a page fault per 4 KiB (~0.3 s per GiB, measured on the first fetches otherwise).
void PrefaultMapping(const std::byte* data, size_t bytes) {
  if (bytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(data) + bytes;
#ifdef MADV_POPULATE_READ
  // In 16 MiB steps: the kernel holds the process's mmap lock (shared) across one call, and a
  // thread mapping or unmapping memory meanwhile (a large allocation) waits for it.
  constexpr uintptr_t kStep = uintptr_t{16} << 20;
  uintptr_t done = begin;
  while (done < end) {
    const uintptr_t step = std::min(kStep, end - done);
    if (madvise(reinterpret_cast<void*>(done), step, MADV_POPULATE_READ) != 0) break;
    done += step;
  }
  if (done >= end) return;
  begin = done;  // not supported (kernel < 5.14): touch the rest page by page
#endif
  volatile const std::byte* p = data;
  for (uintptr_t a = begin; a < end; a += page) {
    (void)p[std::max<intptr_t>(0, static_cast<intptr_t>(a) - reinterpret_cast<intptr_t>(data))];
  }
}

}  // namespace

absl::StatusOr<UcxReadMode> ParseUcxReadMode(absl::string_view name) {
  if (name == "auto") return UcxReadMode::kAuto;
  if (name == "get") return UcxReadMode::kGet;
  if (name == "gather") return UcxReadMode::kGather;
  if (name == "mapped") return UcxReadMode::kMapped;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown UCX read mode '", name, "'; allowed: auto, get, gather, mapped"));
}

absl::string_view UcxReadModeName(UcxReadMode mode) {
  switch (mode) {
    case UcxReadMode::kAuto:
      return "auto";
    case UcxReadMode::kGet:
      return "get";
    case UcxReadMode::kGather:
      return "gather";
    case UcxReadMode::kMapped:
      return "mapped";
  }
  return "?";
}

// A started read: the id of its flush (get mode) or gather op, or an already-known result.
class UcxShardTransport::UcxPending final : public ShardTransport::Pending {
 public:
  uint32_t server = 0;
  uint64_t op = 0;  // 0 = completed in Start with `status`
  absl::Status status;
};

absl::StatusOr<std::unique_ptr<UcxShardTransport>> UcxShardTransport::Create(const Options& options,
                                                                             InfoFetcher fetch_info,
                                                                             Prober probe) {
  auto map = ShardMap::Create(options.map);
  if (!map.ok()) return map.status();
  if (options.num_servers != map->num_shards()) {
    return absl::InvalidArgumentError("UcxShardTransport: num_servers != shard map size");
  }
  std::unique_ptr<UcxShardTransport> t(new UcxShardTransport(options, std::move(*map)));
  t->fetch_info_ = std::move(fetch_info);
  t->probe_ = std::move(probe);
  auto worker = UcxWorker::Create(options.ucx, /*wakeup=*/false);
  if (!worker.ok()) return worker.status();
  t->worker_ = std::move(*worker);

  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  handler.id = kGatherReplyAm;
  handler.cb = &UcxShardTransport::OnGatherReply;
  handler.arg = t.get();
  handler.flags = UCP_AM_FLAG_WHOLE_MSG;
  ucs_status_t status = ucp_worker_set_am_recv_handler(t->worker_->worker(), &handler);
  if (status != UCS_OK) return UcsToStatus(status, "ucp_worker_set_am_recv_handler");

  {
    WorkerLock lock(t.get());
    t->servers_.resize(options.num_servers);
  }
  for (uint32_t s = 0; s < options.num_servers; ++s) {
    absl::Status connected = t->Reconnect(s);
    if (absl::IsFailedPrecondition(connected)) return connected;  // a setting, not an outage
    if (!connected.ok()) {
      GetLogger("shard_client")
          ->warn("ucx_connect_failed shard={} error={}", s, connected.ToString());
    }
  }
  return t;
}

UcxShardTransport::~UcxShardTransport() {
  WorkerLock lock(this);
  for (uint32_t s = 0; s < servers_.size(); ++s) DisconnectLocked(s);
  // The worker goes first, while ops_ is alive for the callbacks its teardown may still run;
  // then abandoned_ (with the members).
  worker_.reset();
}

absl::Status UcxShardTransport::Reconnect(uint32_t server) {
  if (server >= options_.num_servers) return absl::InvalidArgumentError("no such shard");
  auto info = fetch_info_(server);  // an RPC: outside the worker lock
  WorkerLock lock(this);
  if (servers_[server].connecting) {
    return absl::UnavailableError(absl::StrCat("shard ", server, ": already reconnecting"));
  }
  servers_[server].connecting = true;
  absl::Cleanup connected = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    servers_[server].connecting = false;
  };
  DisconnectLocked(server);
  if (!info.ok()) return info.status();
  absl::Status s = ConnectLocked(server, *info);
  if (!s.ok()) DisconnectLocked(server);
  return s;
}

absl::Status UcxShardTransport::ConnectLocked(uint32_t server, const RdmaServerInfo& info) {
  Server& s = servers_[server];
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(info.worker_address.data());
  const bool peer = options_.ucx.error_handling == "peer" ||
                    (options_.ucx.error_handling == "auto" && info.host_id != LocalHostId());
  params.err_mode = peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &UcxShardTransport::OnError;
  params.err_handler.arg = this;
  ucs_status_t status = ucp_ep_create(worker_->worker(), &params, &s.ep);
  if (status != UCS_OK) {
    s.ep = nullptr;
    return UcsToStatus(status, absl::StrCat("ucp_ep_create to shard ", server));
  }
  s.errored = false;
  const ucp_ep_h ep = s.ep;
  auto closed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::UnavailableError(
        absl::StrCat("shard ", server, ": the endpoint was closed during its warm-up"));
  };
  std::vector<std::pair<const std::byte*, size_t>> prefault;
  s.all_mapped = !info.regions.empty();
  for (const RdmaRegionInfo& r : info.regions) {
    Region region;
    region.info = r;
    status = ucp_ep_rkey_unpack(s.ep, r.rkey.data(), &region.rkey);
    if (status != UCS_OK) return UcsToStatus(status, "ucp_ep_rkey_unpack");
    void* mapped = nullptr;
    if (ucp_rkey_ptr(region.rkey, r.base_address, &mapped) == UCS_OK) {
      region.mapped = static_cast<std::byte*>(mapped);
      prefault.emplace_back(region.mapped, r.num_slots * r.stride_bytes);
    } else {
      s.all_mapped = false;
    }
    s.region_index[RegionKey(r.table_id, r.partition)] = s.regions.size();
    s.regions.push_back(std::move(region));
  }
  if (options_.mode == UcxReadMode::kMapped && !s.all_mapped) {
    return absl::FailedPreconditionError(absl::StrCat(
        "read mode 'mapped' needs the shard's memory mapped into this process (shared memory on "
        "one host); shard ",
        server, " is not mappable"));
  }
  // Fault the mapped tables in now (~0.3 s per GiB), with the lock let go: the other servers'
  // reads go on meanwhile. Nothing unmaps them: the server is failed (no read uses it) and
  // connecting (no other reconnect closes it) until this returns.
  if (!prefault.empty()) {
    mu_.Unlock();
    for (const auto& [data, bytes] : prefault) PrefaultMapping(data, bytes);
    Relock();
    if (s.ep != ep) return closed();
  }
  // Wire up every lane now, so the first request pays nothing: one get per region, and an empty
  // gather request (answered with INVALID_ARGUMENT) for the active-message path both ways. The
  // server stays failed (Start refuses it) until this is done; the lock is let go between
  // progress calls, and the endpoint is checked to be still this one after each wait.
  const absl::Time deadline = absl::Now() + options_.warmup_timeout;
  // The warm-up's buffers are freed only once its requests have completed: a request to a stuck
  // peer may be left to UCX in progress (WaitLocked), and then so are they (abandoned_).
  auto warm = std::make_shared<WarmUpBuffers>();
  bool completed = false;
  absl::Cleanup leave = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!completed) abandoned_.push_back(warm);
  };
  for (const Region& region : s.regions) {
    if (region.info.num_slots == 0) continue;
    ucp_request_param_t p{};
    void* req = ucp_get_nbx(s.ep, warm->scratch,
                            std::min<uint64_t>(sizeof(warm->scratch), region.info.stride_bytes),
                            region.info.base_address, region.rkey, &p);
    if (UCS_PTR_IS_ERR(req)) return UcsToStatus(UCS_PTR_STATUS(req), "warm-up get");
    if (req != nullptr) ucp_request_free(req);
  }
  ucp_request_param_t flush{};
  absl::Status flushed =
      WaitLocked(ucp_ep_flush_nbx(s.ep, &flush), server, deadline, "warm-up flush", true);
  if (!flushed.ok()) return flushed;
  if (s.ep != ep) return closed();
  const uint64_t op_id = NewOpLocked(server);
  warm->header = GatherRequestHeader{op_id, 0, 0};
  ucp_request_param_t am{};
  am.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  am.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  void* req =
      ucp_am_send_nbx(s.ep, kGatherRequestAm, &warm->header, sizeof(warm->header), nullptr, 0, &am);
  absl::Status sent = WaitLocked(req, server, deadline, "warm-up gather", true);
  completed = sent.ok();
  auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = ops_.find(op_id);
    return it != ops_.end() && it->second.done;
  };
  while (sent.ok() && s.ep == ep && !s.errored && !answered() && absl::Now() < deadline) {
    ucp_worker_progress(worker_->worker());
    ShareLockBriefly();
  }
  // Answered by the server itself: a close (DisconnectLocked) also completes the op.
  const bool replied = s.ep == ep && answered();
  ops_.erase(op_id);
  if (!sent.ok()) return sent;
  if (s.ep != ep) return closed();
  if (!replied) return absl::UnavailableError(absl::StrCat("shard ", server, ": no AM reply"));
  if (s.errored) {
    return absl::UnavailableError(absl::StrCat("shard ", server, ": endpoint failed in warm-up"));
  }
  s.transports = EndpointTransports(s.ep);
  s.shm = IsShm(s.transports);
  s.gets_emulated = !GetsWithoutServer(s.transports);
  if (options_.mode == UcxReadMode::kGet && s.gets_emulated) {
    return absl::FailedPreconditionError(absl::StrCat(
        "read mode 'get' over ", absl::StrJoin(s.transports, ","), " (shard ", server,
        "): UCX emulates the gets in software and may write a reply into the caller's buffer "
        "after the read was given up; use 'gather' or 'auto'"));
  }
  s.failed = false;
  GetLogger("shard_client")
      ->info("ucx_connected shard={} transports={} mapped={}", server,
             absl::StrJoin(s.transports, ","), s.all_mapped);
  if (options_.on_connected) options_.on_connected(server, s.transports);
  return absl::OkStatus();
}

void UcxShardTransport::DisconnectLocked(uint32_t server) {
  Server& s = servers_[server];
  for (Region& r : s.regions) {
    if (r.rkey != nullptr) ucp_rkey_destroy(r.rkey);
  }
  s.regions.clear();
  s.region_index.clear();
  s.all_mapped = false;
  s.shm = false;
  s.gets_emulated = false;
  s.transports.clear();
  s.failed = true;
  bool close_abandoned = false;
  if (s.ep != nullptr) {
    // Force: cancels whatever is outstanding; once the close completes nothing writes into
    // caller buffers any more.
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(s.ep, &p);
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
      const absl::Time give_up = absl::Now() + kAbandonAfter;
      while (ucp_request_check_status(req) == UCS_INPROGRESS && absl::Now() < give_up) {
        ucp_worker_progress(worker_->worker());
      }
      if (ucp_request_check_status(req) == UCS_INPROGRESS) {
        GetLogger("shard_client")->warn("ucx_close_abandoned shard={}", server);
        close_abandoned = true;
      }
      ucp_request_free(req);  // allowed in progress: UCX finishes it without telling us
    }
    s.ep = nullptr;
  }
  for (auto& [id, op] : ops_) {
    if (op.server != server) continue;
    if (close_abandoned) {  // a send of the op may still read them
      if (op.header != nullptr) abandoned_.push_back(std::move(op.header));
      if (op.rows.capacity() > 0) {
        abandoned_.push_back(std::make_shared<std::vector<uint64_t>>(std::move(op.rows)));
      }
    }
    if (!op.done) {
      op.done = true;
      op.status = absl::UnavailableError(
          absl::StrCat("shard ", server, ": its endpoint was closed before the answer"));
    }
  }
}

uint64_t UcxShardTransport::NewOpLocked(uint32_t server) {
  const uint64_t op_id = next_op_++;
  ops_[op_id].server = server;
  return op_id;
}

void UcxShardTransport::ShareLockBriefly() {
  mu_.Unlock();
  absl::SleepFor(absl::Microseconds(20));
  Relock();
}

void UcxShardTransport::Relock() const {
  // Counted while waiting: a thread taking the lock (or taking it back) may be a read that another
  // thread's long wait must let in.
  contenders_.fetch_add(1, std::memory_order_relaxed);
  mu_.Lock();
  contenders_.fetch_sub(1, std::memory_order_relaxed);
}

absl::Status UcxShardTransport::WaitLocked(void* request, uint32_t server, absl::Time deadline,
                                           absl::string_view what, bool share_lock) {
  if (request == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(request)) return UcsToStatus(UCS_PTR_STATUS(request), what);
  ucs_status_t status;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    ucp_worker_progress(worker_->worker());
    if (share_lock) ShareLockBriefly();
    if (absl::Now() > deadline) {
      // UCX cancels only receives; a flush or a send to a stuck peer stays in progress until its
      // endpoint goes away. Give the cancel a moment, then force-close the endpoint.
      ucp_request_cancel(worker_->worker(), request);
      const absl::Time grace = absl::Now() + absl::Milliseconds(100);
      while (ucp_request_check_status(request) == UCS_INPROGRESS && absl::Now() < grace) {
        ucp_worker_progress(worker_->worker());
        if (share_lock) ShareLockBriefly();
      }
      if (ucp_request_check_status(request) == UCS_INPROGRESS) DisconnectLocked(server);
      // Even a force-closed endpoint may not complete a send to a stopped peer (UCX 1.13 over
      // shared memory): after a bounded moment the request is handed back to UCX as it is
      // (ucp_request_free is allowed in progress; the callers keep its buffers).
      const absl::Time give_up = absl::Now() + kAbandonAfter;
      while (ucp_request_check_status(request) == UCS_INPROGRESS && absl::Now() < give_up) {
        ucp_worker_progress(worker_->worker());
        if (share_lock) ShareLockBriefly();
      }
      const bool abandoned = ucp_request_check_status(request) == UCS_INPROGRESS;
      ucp_request_free(request);
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": timed out", abandoned ? " (the peer is stuck)" : ""));
    }
  }
  ucp_request_free(request);
  return UcsToStatus(status, what);
}

void UcxShardTransport::OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  // Runs inside ucp_worker_progress, i.e. with mu_ held by the progressing thread.
  auto* self = static_cast<UcxShardTransport*>(arg);
  for (uint32_t i = 0; i < self->servers_.size(); ++i) {
    if (self->servers_[i].ep == ep) {
      self->servers_[i].failed = true;
      self->servers_[i].errored = true;
      GetLogger("shard_client")
          ->warn("ucx_endpoint_failed shard={} status={}", i, UcsStatusString(status));
    }
  }
}

void UcxShardTransport::OnOpDone(void* request, ucs_status_t status, void* user_data) {
  // user_data points at a {transport, op id} pair allocated by the starter.
  auto* ctx = static_cast<std::pair<UcxShardTransport*, uint64_t>*>(user_data);
  auto it = ctx->first->ops_.find(ctx->second);
  if (it != ctx->first->ops_.end() && !it->second.done) {
    it->second.done = true;
    it->second.status = UcsToStatus(status, "ucx read");
  }
  delete ctx;
  ucp_request_free(request);
}

std::vector<const UcxShardTransport::Region*> UcxShardTransport::RegionsOf(
    const Server& s, const TableSpec& spec) const {
  std::vector<const Region*> regions(map_.num_shards(), nullptr);
  for (uint32_t p = 0; p < regions.size(); ++p) {
    auto it = s.region_index.find(RegionKey(spec.id, p));
    if (it != s.region_index.end()) regions[p] = &s.regions[it->second];
  }
  return regions;
}

std::span<const uint32_t> UcxShardTransport::PartitionsOf(const TableSpec& spec,
                                                          const ReadBatch& batch,
                                                          std::vector<uint32_t>* scratch) const {
  if (batch.partitions.size() == batch.rows.size()) return batch.partitions;
  const TableLayout layout = map_.Layout(spec);
  scratch->resize(batch.rows.size());
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    (*scratch)[i] = layout.PartitionOfSlot(batch.slots[i]);
  }
  return *scratch;
}

UcxReadMode UcxShardTransport::ModeFor(uint32_t server, size_t rows) const {
  WorkerLock lock(this);
  return ModeForLocked(server, rows);
}

UcxReadMode UcxShardTransport::ModeForLocked(uint32_t server, size_t rows) const {
  const Server& s = servers_[server];
  if (options_.mode != UcxReadMode::kAuto) return options_.mode;
  if (s.all_mapped) return UcxReadMode::kMapped;
  if (s.gets_emulated) return UcxReadMode::kGather;
  uint32_t threshold = s.shm ? options_.ucx.gather_min_rows_shm : options_.ucx.gather_min_rows_tcp;
  return rows >= threshold ? UcxReadMode::kGather : UcxReadMode::kGet;
}

absl::Status UcxShardTransport::ReadMapped(uint32_t server, const TableSpec& spec,
                                           const ReadBatch& batch) {
  const Server& s = servers_[server];
  const size_t row_bytes = spec.row_bytes();
  const std::vector<const Region*> regions = RegionsOf(s, spec);
  std::vector<uint32_t> scratch;
  const std::span<const uint32_t> partitions = PartitionsOf(spec, batch, &scratch);
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    const Region* r = regions[partitions[i]];
    if (r == nullptr || r->mapped == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("row ", batch.rows[i], " of table ", spec.id,
                                                     " is not mapped from shard ", server));
    }
    std::memcpy(batch.dst[i],
                r->mapped + (batch.slots[i] - r->info.first_slot) * r->info.stride_bytes,
                row_bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> UcxShardTransport::StartGetsLocked(uint32_t server, const TableSpec& spec,
                                                            const ReadBatch& batch) {
  Server& s = servers_[server];
  const size_t row_bytes = spec.row_bytes();
  const std::vector<const Region*> regions = RegionsOf(s, spec);
  std::vector<uint32_t> scratch;
  const std::span<const uint32_t> partitions = PartitionsOf(spec, batch, &scratch);
  // Every row's region first: a row this server does not hold is refused before any get is
  // issued, so nothing is left writing into dst.
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    if (regions[partitions[i]] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("row ", batch.rows[i], " of table ", spec.id,
                                                     " is not held by shard ", server));
    }
  }
  ucp_request_param_t param{};
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    const Region* r = regions[partitions[i]];
    const uint64_t remote =
        r->info.base_address + (batch.slots[i] - r->info.first_slot) * r->info.stride_bytes;
    void* req = ucp_get_nbx(s.ep, batch.dst[i], row_bytes, remote, r->rkey, &param);
    if (UCS_PTR_IS_ERR(req)) {
      // The gets already issued may still land in dst: flush them before reporting (a UCX
      // failure, rare; the lock stays held, so the endpoint cannot change meanwhile).
      ucp_request_param_t flush{};
      WaitLocked(ucp_ep_flush_nbx(s.ep, &flush), server, absl::Now() + absl::Seconds(1), "flush")
          .IgnoreError();
      return UcsToStatus(UCS_PTR_STATUS(req), "ucp_get_nbx");
    }
    if (req != nullptr) ucp_request_free(req);  // completion is tracked by the flush below
  }
  const uint64_t op_id = NewOpLocked(server);
  ucp_request_param_t flush{};
  flush.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  flush.cb.send = &UcxShardTransport::OnOpDone;
  flush.user_data = new std::pair<UcxShardTransport*, uint64_t>(this, op_id);
  void* req = ucp_ep_flush_nbx(s.ep, &flush);
  if (req == nullptr) {
    delete static_cast<std::pair<UcxShardTransport*, uint64_t>*>(flush.user_data);
    ops_[op_id].done = true;
  } else if (UCS_PTR_IS_ERR(req)) {
    delete static_cast<std::pair<UcxShardTransport*, uint64_t>*>(flush.user_data);
    ops_[op_id].done = true;
    ops_[op_id].status = UcsToStatus(UCS_PTR_STATUS(req), "ucp_ep_flush_nbx");
  }
  // Otherwise OnOpDone completes the op and frees the request.
  return op_id;
}

absl::StatusOr<uint64_t> UcxShardTransport::StartGatherLocked(uint32_t server,
                                                              const TableSpec& spec,
                                                              const ReadBatch& batch) {
  Server& s = servers_[server];
  const uint64_t op_id = NewOpLocked(server);
  Op& op = ops_[op_id];
  op.dst.assign(batch.dst.begin(), batch.dst.end());
  op.row_bytes = spec.row_bytes();
  op.rows.assign(batch.rows.begin(), batch.rows.end());
  // UCX 1.13 reads the header until the send completes (there is no COPY_HEADER flag yet).
  op.header = std::make_unique<GatherRequestHeader>(
      GatherRequestHeader{op_id, spec.id, static_cast<uint32_t>(batch.rows.size())});
  ucp_request_param_t am{};
  am.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  am.flags = UCP_AM_SEND_FLAG_REPLY;
  // The op's header and rows stay alive until the reply arrives, which is after the send
  // completed (or, when an endpoint's close is left to UCX, in abandoned_).
  void* req = ucp_am_send_nbx(s.ep, kGatherRequestAm, op.header.get(), sizeof(GatherRequestHeader),
                              op.rows.data(), op.rows.size() * sizeof(uint64_t), &am);
  if (UCS_PTR_IS_ERR(req)) {
    ops_.erase(op_id);
    return UcsToStatus(UCS_PTR_STATUS(req), "ucp_am_send_nbx");
  }
  if (req != nullptr) ucp_request_free(req);
  return op_id;
}

void UcxShardTransport::DeliverGather(const GatherReplyHeader& h, const std::byte* bytes,
                                      size_t n) {
  auto it = ops_.find(h.request_id);
  if (it == ops_.end() || it->second.done) return;  // timed out and abandoned: drop
  Op& op = it->second;
  op.done = true;
  if (h.code != 0) {
    op.status = absl::Status(static_cast<absl::StatusCode>(h.code),
                             std::string(reinterpret_cast<const char*>(bytes), n));
  } else if (h.count != op.dst.size() || h.row_bytes != op.row_bytes ||
             n != size_t{h.count} * h.row_bytes) {
    op.status = absl::InternalError("gather reply does not match the request");
  } else {
    for (size_t i = 0; i < op.dst.size(); ++i) {
      std::memcpy(op.dst[i], bytes + i * op.row_bytes, op.row_bytes);
    }
  }
}

void UcxShardTransport::FailOp(uint64_t op_id, const absl::Status& status) {
  auto it = ops_.find(op_id);
  if (it == ops_.end() || it->second.done) return;
  it->second.done = true;
  it->second.status = status;
}

// A reply to one of our gather requests (runs inside ucp_worker_progress, mu_ held). Rows are
// scattered into the caller's buffers only while the op is still waited for.
ucs_status_t UcxShardTransport::OnGatherReply(void* arg, const void* header, size_t header_length,
                                              void* data, size_t length,
                                              const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxShardTransport*>(arg);
  if (header_length != sizeof(GatherReplyHeader)) return UCS_OK;
  GatherReplyHeader reply;
  std::memcpy(&reply, header, sizeof(reply));
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    self->DeliverGather(reply, static_cast<const std::byte*>(data), length);
    return UCS_OK;
  }
  // Rendezvous: receive into a staging buffer owned by the receive itself (it may outlive the
  // op when the caller gave up), then scatter.
  struct RecvCtx {
    UcxShardTransport* self;
    GatherReplyHeader header;
    std::unique_ptr<std::byte[]> staging;  // not zero-filled: the receive overwrites it
    size_t size;
  };
  auto* ctx = new RecvCtx{self, reply, std::unique_ptr<std::byte[]>(new std::byte[length]), length};
  ucp_request_param_t rparam{};
  rparam.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rparam.user_data = ctx;
  rparam.cb.recv_am = [](void* req, ucs_status_t status, size_t /*len*/, void* user) {
    auto* c = static_cast<RecvCtx*>(user);
    if (status == UCS_OK) {
      c->self->DeliverGather(c->header, c->staging.get(), c->size);
    } else {
      c->self->FailOp(c->header.request_id, UcsToStatus(status, "gather reply receive"));
    }
    delete c;
    ucp_request_free(req);
  };
  void* req =
      ucp_am_recv_data_nbx(self->worker_->worker(), data, ctx->staging.get(), length, &rparam);
  if (req == nullptr) {
    self->DeliverGather(ctx->header, ctx->staging.get(), ctx->size);
    delete ctx;
  } else if (UCS_PTR_IS_ERR(req)) {
    self->FailOp(reply.request_id, UcsToStatus(UCS_PTR_STATUS(req), "gather reply receive"));
    delete ctx;
  }
  // Otherwise the callback completes and frees the request (ucp_request_free before completion
  // would cancel the callback).
  return UCS_OK;
}

absl::StatusOr<std::unique_ptr<ShardTransport::Pending>> UcxShardTransport::Start(
    uint32_t server, const TableSpec& spec, const ReadBatch& batch, absl::Time /*deadline*/) {
  if (server >= options_.num_servers) return absl::InvalidArgumentError("no such shard");
  auto pending = std::make_unique<UcxPending>();
  pending->server = server;
  WorkerLock lock(this);
  const UcxReadMode mode = ModeForLocked(server, batch.rows.size());
  if (servers_[server].failed || servers_[server].ep == nullptr) {
    return absl::UnavailableError(absl::StrCat("shard ", server, " is not connected"));
  }
  absl::StatusOr<uint64_t> op;
  switch (mode) {
    case UcxReadMode::kMapped:
      pending->status = ReadMapped(server, spec, batch);
      return pending;
    case UcxReadMode::kGather:
      op = StartGatherLocked(server, spec, batch);
      break;
    default:
      op = StartGetsLocked(server, spec, batch);
      break;
  }
  if (!op.ok()) return op.status();  // nothing left writing into dst (StartGetsLocked)
  pending->op = *op;
  return pending;
}

absl::Status UcxShardTransport::Finish(Pending& base, absl::Time deadline) {
  auto& pending = static_cast<UcxPending&>(base);
  if (pending.op == 0) return pending.status;
  WorkerLock lock(this);
  ucp_worker_h worker = worker_->worker();
  const absl::Time waiting_since = absl::Now();
  for (int spins = 0;; ++spins) {
    auto it = ops_.find(pending.op);
    if (it == ops_.end()) return absl::InternalError("unknown UCX op");
    if (it->second.done) {
      absl::Status status = it->second.status;
      ops_.erase(it);
      if (servers_[pending.server].failed && status.ok()) {
        status = absl::UnavailableError(absl::StrCat("shard ", pending.server, " failed"));
      }
      return status;
    }
    // The endpoint is closed before the op goes: a gather's row ids must outlive its send.
    if (servers_[pending.server].failed) {
      DisconnectLocked(pending.server);
      ops_.erase(pending.op);
      return absl::UnavailableError(absl::StrCat("shard ", pending.server, " endpoint failed"));
    }
    ucp_worker_progress(worker);
    if ((spins & 63) != 0) continue;
    const absl::Time now = absl::Now();
    if (now > deadline) {
      DisconnectLocked(pending.server);  // cancels the reads still writing into dst
      ops_.erase(pending.op);
      return absl::DeadlineExceededError(
          absl::StrCat("shard ", pending.server, ": no answer before the deadline"));
    }
    // A slow answer: let the other reads have the worker between progress calls (any thread's
    // progress completes every op), or one stalled shard would hold up every read of the node
    // until this read's deadline. Only when someone waits for it: a lone slow read keeps going.
    if (now - waiting_since > kShareLockAfter && contenders_.load(std::memory_order_relaxed) > 0) {
      ShareLockBriefly();
    }
  }
}

absl::Status UcxShardTransport::Probe(uint32_t server, absl::Time deadline) {
  return probe_ ? probe_(server, deadline) : absl::OkStatus();
}

std::vector<std::string> UcxShardTransport::EndpointTransportsOf(uint32_t server) const {
  WorkerLock lock(this);
  return server < servers_.size() ? servers_[server].transports : std::vector<std::string>{};
}

}  // namespace hlem::shard
