#pragma once
// The shard's UCX data plane.
//
// Table memory is allocated by UCX (ucp_mem_map with UCP_MEM_MAP_ALLOCATE) so that clients read
// rows with truly one-sided gets over shared memory; memory registered from malloc would make
// every get a software emulation that hangs without target progress. A progress thread always
// runs (over tcp every get needs it) and serves gathered reads: a client sends the row ids in one
// active message and the server packs the rows into one reply.
//
// Lifecycle: Create -> use as the ShardStore's RegionAllocator -> Start(store) -> Stop. The
// server must outlive the store's regions. Thread-safe after Start (only the progress thread
// touches the worker).

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "embedding_shard/core/shard_store.h"
#include "embedding_shard/transport/ucx_common.h"

namespace hlem::shard {

class UcxShardServer final : public RegionAllocator {
 public:
  // Called after each gathered read: rows, bytes, seconds spent, status code.
  using GatherObserver =
      std::function<void(size_t rows, size_t bytes, double seconds, absl::StatusCode code)>;

  static absl::StatusOr<std::unique_ptr<UcxShardServer>> Create(const UcxOptions& options);
  ~UcxShardServer() override;

  absl::StatusOr<std::unique_ptr<Region>> Allocate(size_t bytes) override;

  // Packs remote keys for every segment, installs the gather handler, starts progress.
  absl::Status Start(const ShardStore* store, GatherObserver observer);
  void Stop();

  const RdmaServerInfo& info() const { return info_; }

 private:
  explicit UcxShardServer(const UcxOptions& options) : options_(options) {}
  void ProgressLoop();
  static ucs_status_t OnGatherRequest(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param);
  void ServeGather(const GatherRequestHeader& request, const uint64_t* rows, ucp_ep_h reply_ep);
  void SendError(uint64_t request_id, const absl::Status& status, ucp_ep_h reply_ep);

  UcxOptions options_;
  std::unique_ptr<UcxWorker> worker_;
  const ShardStore* store_ = nullptr;
  GatherObserver observer_;
  RdmaServerInfo info_;
  std::thread progress_;
  std::atomic<bool> stop_{false};
  int wake_fd_ = -1;  // eventfd to interrupt the progress thread's wait
};

}  // namespace hlem::shard
