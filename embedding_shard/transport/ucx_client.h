#pragma once
// ShardTransport over UCX. One worker and one endpoint per shard server, wired up at creation
// (never on the first request). Three ways to read a batch, chosen per batch:
//   - get:    one ucp_get_nbx per row straight into the caller's buffer (no server CPU over
//             shared memory; bounded by the message rate),
//   - gather: the row ids go in one active message; the server packs the rows into one reply,
//   - mapped: over shared memory UCX can map the server's table memory into this process
//             (ucp_rkey_ptr); rows are then copied with memcpy, still without server CPU.
// kAuto uses mapped where available, else gather where UCX emulates gets (tcp) and for batches of
// at least the transport's threshold (UcxOptions::gather_min_rows_*), else get. Emulated gets are
// never used (kGet is refused there): their replies can land after a read was given up.
//
// Thread-safe: calls are serialised on one mutex around the worker; a read whose answer is late
// (Finish), a connection's warm-up and prefault let it go between steps, so that one slow or
// stalled shard does not hold up the reads from the others.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "embedding_shard/core/shard_client.h"
#include "embedding_shard/transport/ucx_common.h"

namespace hlem::shard {

enum class UcxReadMode { kAuto, kGet, kGather, kMapped };
absl::StatusOr<UcxReadMode> ParseUcxReadMode(absl::string_view name);
absl::string_view UcxReadModeName(UcxReadMode mode);

class UcxShardTransport final : public ShardTransport {
 public:
  using InfoFetcher = std::function<absl::StatusOr<RdmaServerInfo>(uint32_t server)>;
  using Prober = std::function<absl::Status(uint32_t server, absl::Time deadline)>;

  struct Options {
    UcxOptions ucx;
    UcxReadMode mode = UcxReadMode::kAuto;
    uint32_t num_servers = 1;
    ShardMapOptions map;  // to turn row ids into remote addresses
    // A (re)connection's warm-up (one get per region, one gather round trip) waits this long for
    // the server at most.
    absl::Duration warmup_timeout = absl::Seconds(10);
    // Called (with the worker lock held: keep it cheap) after each successful (re)connect with
    // the transports the endpoint's lanes use, so a silent fallback (e.g. to tcp) is visible.
    std::function<void(uint32_t server, const std::vector<std::string>& transports)> on_connected;
  };

  // Connects to every server (fetching its RdmaServerInfo through fetch_info). A server that
  // cannot be reached is left disconnected (reads fail with UNAVAILABLE until Reconnect).
  static absl::StatusOr<std::unique_ptr<UcxShardTransport>> Create(const Options& options,
                                                                   InfoFetcher fetch_info,
                                                                   Prober probe);
  ~UcxShardTransport() override;

  std::string name() const override { return "ucx"; }
  uint32_t num_servers() const override { return options_.num_servers; }
  absl::StatusOr<std::unique_ptr<Pending>> Start(uint32_t server, const TableSpec& spec,
                                                 const ReadBatch& batch,
                                                 absl::Time deadline) override;
  absl::Status Finish(Pending& pending, absl::Time deadline) override;
  absl::Status Probe(uint32_t server, absl::Time deadline) override;
  absl::Status Reconnect(uint32_t server) override;

  // The transports the endpoint to `server` uses (e.g. {"posix/memory"}), empty if down.
  std::vector<std::string> EndpointTransportsOf(uint32_t server) const;
  // The mode a batch of `rows` rows to `server` would use.
  UcxReadMode ModeFor(uint32_t server, size_t rows) const;

 private:
  struct Region {
    RdmaRegionInfo info;
    ucp_rkey_h rkey = nullptr;
    std::byte* mapped = nullptr;  // ucp_rkey_ptr result, when the memory is mapped here
  };
  struct Server {
    ucp_ep_h ep = nullptr;
    bool failed = true;
    bool shm = false;
    bool all_mapped = false;
    bool gets_emulated = false;  // the server answers each get (tcp): gathers only
    bool connecting = false;  // a Reconnect is warming the endpoint up (the lock let go meanwhile)
    bool errored = false;     // the endpoint's error handler ran (since it was created)
    std::vector<std::string> transports;
    absl::flat_hash_map<uint64_t, size_t> region_index;  // (table, partition) -> regions[i]
    std::vector<Region> regions;
  };
  struct Op {
    uint32_t server = 0;  // whose endpoint carries it: closing that endpoint fails it
    bool done = false;
    absl::Status status;
    // gather replies only
    std::vector<std::byte*> dst;
    size_t row_bytes = 0;
    // The request (header and row ids), alive until the send completes: on the heap, as ops_
    // moves its values.
    std::unique_ptr<GatherRequestHeader> header;
    std::vector<uint64_t> rows;
  };
  class UcxPending;
  // mu_, held for a scope; counts the threads waiting for it meanwhile (contenders_), so that a
  // long wait lets the lock go only when someone wants it.
  class ABSL_SCOPED_LOCKABLE WorkerLock {
   public:
    explicit WorkerLock(const UcxShardTransport* t) ABSL_EXCLUSIVE_LOCK_FUNCTION(t->mu_) : t_(t) {
      t_->Relock();
    }
    ~WorkerLock() ABSL_UNLOCK_FUNCTION() { t_->mu_.Unlock(); }
    WorkerLock(const WorkerLock&) = delete;
    WorkerLock& operator=(const WorkerLock&) = delete;

   private:
    const UcxShardTransport* t_;
  };

  UcxShardTransport(const Options& options, ShardMap map)
      : options_(options), map_(std::move(map)) {}
  // Creates the endpoint and warms every lane up. The warm-up waits for the server (up to
  // warmup_timeout for one that is stuck) and lets the lock go between progress calls meanwhile, so
  // that reads from the other servers go on; the server stays failed (Start refuses it) until it is
  // done.
  absl::Status ConnectLocked(uint32_t server, const RdmaServerInfo& info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Force-closes the server's endpoint (nothing writes into caller buffers afterwards) and fails
  // every op still out on it with UNAVAILABLE: a reply can no longer come on that endpoint, and a
  // reconnect must not leave them waiting out their deadline.
  void DisconnectLocked(uint32_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NewOpLocked(uint32_t server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  UcxReadMode ModeForLocked(uint32_t server, size_t rows) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for a request on server `server`'s endpoint until `deadline`. Past it the request is
  // cancelled, and if UCX cannot cancel it (flushes and sends) the endpoint is force-closed, which
  // completes it: the wait is bounded either way (the server is then disconnected).
  // `share_lock`: let the lock go between progress calls (the warm-up's waits).
  absl::Status WaitLocked(void* request, uint32_t server, absl::Time deadline,
                          absl::string_view what, bool share_lock = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets other threads take the lock for a moment (between two progress calls of a long wait).
  void ShareLockBriefly() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes mu_ (first, or back after this thread let it go), counted in contenders_ meanwhile.
  void Relock() const ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_);
  // Region of every partition of `spec` on server `s` (null where it holds none), looked up once
  // per batch so the per-row work is an index and a multiply.
  std::vector<const Region*> RegionsOf(const Server& s, const TableSpec& spec) const;
  // The partition of each row of the batch (from the batch, or derived from the layout).
  std::span<const uint32_t> PartitionsOf(const TableSpec& spec, const ReadBatch& batch,
                                         std::vector<uint32_t>* scratch) const;
  absl::StatusOr<uint64_t> StartGetsLocked(uint32_t server, const TableSpec& spec,
                                           const ReadBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint64_t> StartGatherLocked(uint32_t server, const TableSpec& spec,
                                             const ReadBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReadMapped(uint32_t server, const TableSpec& spec, const ReadBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnGatherReply(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param);
  static void OnOpDone(void* request, ucs_status_t status, void* user_data);
  void DeliverGather(const GatherReplyHeader& header, const std::byte* bytes, size_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailOp(uint64_t op_id, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const ShardMap map_;
  InfoFetcher fetch_info_;
  Prober probe_;
  std::unique_ptr<UcxWorker> worker_;

  mutable absl::Mutex mu_;
  mutable std::atomic<int> contenders_{0};  // threads waiting in WorkerLock for mu_
  std::vector<Server> servers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Op> ops_ ABSL_GUARDED_BY(mu_);
  uint64_t next_op_ ABSL_GUARDED_BY(mu_) = 1;
  // Buffers of requests left to UCX in progress (a close or a send to a stuck peer): UCX may still
  // read or write them, so they live until the worker is gone.
  std::vector<std::shared_ptr<void>> abandoned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::shard
