#pragma once
// Reading embedding rows from the shard servers: the interface the serving node (and the
// benchmark, tools and tests) use, independent of the transport underneath.
//
// ShardClient splits a batch by partition, sends each server its rows through a ShardTransport
// (UCX or gRPC), and fails over to the next replica of a partition when a server is down or does
// not answer in time. Server health is also probed in the background (every probe_interval), so a
// dead server is skipped before a request has to time out on it.
//
// Thread-safe: Fetch may be called from many threads at once.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "embedding_shard/core/shard_map.h"
#include "embedding_shard/core/table.h"

namespace hlem::shard {

// Rows to read from one server: row ids, their slots and partitions (computed once by the client
// from the table's layout) and where each row goes (row_bytes each).
struct ReadBatch {
  std::span<const uint64_t> rows;
  std::span<const uint64_t> slots;
  std::span<std::byte* const> dst;
  std::span<const uint32_t> partitions;  // may be empty: the transport then derives them
};

// One way of reading rows from any of the servers (index = shard index).
class ShardTransport {
 public:
  class Pending {
   public:
    virtual ~Pending() = default;
  };
  virtual ~ShardTransport() = default;
  virtual std::string name() const = 0;
  virtual uint32_t num_servers() const = 0;
  // Starts reading the batch's rows of `spec` (all held by `server`) so that row i lands at
  // dst[i]. The caller keeps the batch's arrays alive until Finish returns.
  virtual absl::StatusOr<std::unique_ptr<Pending>> Start(uint32_t server, const TableSpec& spec,
                                                         const ReadBatch& batch,
                                                         absl::Time deadline) = 0;
  // Waits for a started read. Whatever it returns, nothing is written into dst after it returns.
  // UNAVAILABLE / DEADLINE_EXCEEDED mean the server failed (the caller may fail over); other codes
  // are the server's verdict on the request.
  virtual absl::Status Finish(Pending& pending, absl::Time deadline) = 0;
  // Cheap liveness check of one server (e.g. gRPC health); OK when it serves.
  virtual absl::Status Probe(uint32_t server, absl::Time deadline) = 0;
  // Re-establishes a server's connection after a failure (called when a probe succeeds again).
  virtual absl::Status Reconnect(uint32_t server) = 0;
};

// Told about every Fetch and every health change (metrics live behind this; see
// embedding_shard/client/shard_client_metrics.h). Called from the fetching threads and the probe
// timer: implementations must be thread-safe and cheap.
class ShardClientObserver {
 public:
  virtual ~ShardClientObserver() = default;
  virtual void OnFetch(size_t rows, size_t bytes, absl::Duration latency,
                       absl::StatusCode code) = 0;
  virtual void OnFailover() = 0;
  virtual void OnServerHealth(uint32_t server, bool healthy) = 0;
};

struct ShardClientOptions {
  std::vector<TableSpec> tables;
  ShardMapOptions map;
  uint32_t max_batch_rows = 65536;  // per request to one server (the servers' limit)
  // Background probing; also the only way a server marked down comes back (0 disables both).
  absl::Duration probe_interval = absl::Milliseconds(500);
  absl::Duration probe_timeout = absl::Milliseconds(300);
  // A server that answers its probe but fails to reconnect is tried again after this, doubling
  // after each failure: a reconnect can hold the transport (UCX's warm-up) for seconds, and every
  // probe round retrying it would stall the fetches to the healthy replicas behind it.
  absl::Duration reconnect_backoff_min = absl::Milliseconds(500);
  absl::Duration reconnect_backoff_max = absl::Seconds(30);
  // How long one server may take before its rows are re-sent to the next replica (when one is
  // left; the last replica gets the whole deadline). A dead peer over shared memory reports no
  // error, so without this a read would wait for the caller's deadline.
  absl::Duration attempt_timeout = absl::Milliseconds(250);
  std::shared_ptr<ShardClientObserver> observer;  // optional
};

class ShardClient {
 public:
  static absl::StatusOr<std::unique_ptr<ShardClient>> Create(
      const ShardClientOptions& options, std::unique_ptr<ShardTransport> transport, Clock& clock);
  ~ShardClient();

  // Reads `rows` of table `table_id` into out, packed in request order
  // (out.size() == rows.size() * row_bytes). Errors: INVALID_ARGUMENT (unknown table, empty
  // batch, wrong output size), OUT_OF_RANGE (row id >= rows), UNAVAILABLE (every replica of a
  // needed partition is down), DEADLINE_EXCEEDED.
  absl::Status Fetch(uint32_t table_id, std::span<const uint64_t> rows, std::span<std::byte> out,
                     absl::Time deadline);
  // Same, with a destination pointer per row (e.g. straight into cache slots).
  absl::Status FetchInto(uint32_t table_id, std::span<const uint64_t> rows,
                         std::span<std::byte* const> dst, absl::Time deadline);

  const TableSpec* FindTable(uint32_t table_id) const;
  const ShardMap& map() const { return map_; }
  ShardTransport& transport() { return *transport_; }
  bool IsHealthy(uint32_t server) const;
  // Runs one probe round now (the background timer does this every probe_interval).
  void ProbeAll();

  struct Counters {
    uint64_t failovers = 0;  // server groups re-sent to another replica
    uint64_t server_failures = 0;
  };
  Counters counters() const;

 private:
  ShardClient(const ShardClientOptions& options, ShardMap map,
              std::unique_ptr<ShardTransport> transport, Clock& clock);
  // `ups`: the server's count of returns (ups_) when the failing read was started; a failure from
  // before its latest return (e.g. a read the reconnect itself failed) does not mark it down.
  void MarkDown(uint32_t server, std::optional<uint64_t> ups = std::nullopt);
  uint64_t Ups(uint32_t server) const;
  absl::Status FetchOnce(uint32_t table_id, std::span<const uint64_t> rows,
                         std::span<std::byte* const> dst, absl::Time deadline);
  void ScheduleProbe();

  const ShardClientOptions options_;
  const ShardMap map_;
  std::unique_ptr<ShardTransport> transport_;
  Clock& clock_;

  mutable absl::Mutex mu_;
  std::vector<bool> down_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> ups_ ABSL_GUARDED_BY(mu_);  // per server: times it came back up
  // Per server while down: no reconnect before next_reconnect_, then wait reconnect_wait_ more.
  std::vector<absl::Time> next_reconnect_ ABSL_GUARDED_BY(probe_mu_);
  std::vector<absl::Duration> reconnect_wait_ ABSL_GUARDED_BY(probe_mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  TimerId probe_timer_ ABSL_GUARDED_BY(mu_) = 0;
  // Held by a running probe callback; the destructor waits until no callback holds it.
  std::shared_ptr<int> probe_token_ = std::make_shared<int>(0);
  absl::Mutex probe_mu_;  // one probe round at a time
};

}  // namespace hlem::shard
