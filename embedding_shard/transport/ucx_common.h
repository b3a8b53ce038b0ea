#pragma once
// Shared pieces of the UCX data plane: context/worker setup from UcxOptions, the wire format of the
// gathered-read active messages, and the description of a server's registered memory that clients
// receive through GetRdmaInfo.

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "embedding_shard/core/shard_config.h"

namespace hlem::shard {

// Active-message ids of the gathered read.
inline constexpr uint16_t kGatherRequestAm = 17;
inline constexpr uint16_t kGatherReplyAm = 18;

// Client -> server header; the data is `count` little-endian uint64 row ids.
struct GatherRequestHeader {
  uint64_t request_id;
  uint32_t table_id;
  uint32_t count;
};

// Server -> client header; the data is count * row_bytes bytes of rows in request order when
// code == 0 (absl::StatusCode::kOk), else the error message.
struct GatherReplyHeader {
  uint64_t request_id;
  int32_t code;
  uint32_t row_bytes;
  uint32_t count;
  uint32_t reserved;
};

// One registered (table, partition) segment of a server.
struct RdmaRegionInfo {
  uint32_t table_id = 0;
  uint32_t partition = 0;
  uint64_t base_address = 0;
  std::string rkey;  // packed remote key
  uint64_t stride_bytes = 0;
  uint64_t first_slot = 0;
  uint64_t num_slots = 0;
};

struct RdmaServerInfo {
  std::string worker_address;
  std::string host_id;
  std::vector<std::string> transports;
  std::vector<RdmaRegionInfo> regions;
};

// Hostname + kernel boot id: equal on two processes of one machine (and one boot).
std::string LocalHostId();

std::string UcsStatusString(ucs_status_t status);
absl::Status UcsToStatus(ucs_status_t status, absl::string_view what);

// Owns a ucp_context + one worker (thread mode SERIALIZED: callers serialise access).
class UcxWorker {
 public:
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(const UcxOptions& options, bool wakeup);
  ~UcxWorker();
  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  std::string address() const { return address_; }
  // The transports this context can use (e.g. "posix/memory", "tcp/lo"); an endpoint picks from
  // these (EndpointTransports).
  std::vector<std::string> Transports() const;

 private:
  UcxWorker() = default;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
};

// "tls/device" pairs named in ucp_*_print_info output, deduplicated, in order.
std::vector<std::string> ParseTransportsFromInfo(const std::string& info);
// The transports an endpoint's lanes use.
std::vector<std::string> EndpointTransports(ucp_ep_h ep);

}  // namespace hlem::shard
