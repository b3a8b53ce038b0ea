#pragma once
// The embedding shards of the digital twin, for shard faults (issue 11): which server holds each
// partition (the real shard::ShardMap), whether each server is up, killed or stopped, and how each
// node's shard client sees them. A fetch follows embedding_shard/core/shard_client.cc's rules on
// the simulated clock, without threads or bytes:
//   - per round, every partition still needed goes to the first replica the client believes up;
//     none left: UNAVAILABLE ("no live replica");
//   - a server that is not serving fails its group: at once when it is dead and the transport
//     sees that (gRPC: the connection is refused), else at the group's deadline (a SIGSTOPped
//     server; a dead one over UCX shared memory, which reports nothing): attempt_timeout when
//     every partition of the group has another replica left, the request's deadline otherwise;
//     the client marks it down and sends those partitions to their next replica in the next
//     round; past the request's deadline the fetch fails DEADLINE_EXCEEDED;
//   - every probe_interval since the client started it probes every server: a killed server
//     fails at once (connection refused), a stopped one after probe_timeout; the client's view of
//     a server is the latest of its probes' verdicts and the failures it saw, so a server marked
//     down comes back at the first probe after it serves again.
// A fetch is decided when it starts, from the servers' states then: a server stopped or resumed
// while a fetch is in flight changes only the fetches that start after it (the twin's fetch is a
// delay, not a conversation). The time of the successful last round is the cost model's; this
// class adds what the failed attempts cost.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "embedding_shard/core/shard_client.h"
#include "embedding_shard/core/shard_map.h"

namespace hlem::sim {

struct SimShardOptions {
  // The shard map, the tables and the clients' timings (probe_interval, probe_timeout,
  // attempt_timeout), as the nodes' config gives them (shard::ClientOptionsFor).
  shard::ShardClientOptions client;
  // Whether a killed server fails a fetch at once (the gRPC transport: connection refused) or only
  // at the attempt's deadline (UCX over shared memory).
  bool dead_refuses = true;
};

class SimShards {
 public:
  enum class State { kUp, kKilled, kStopped };

  // Errors name the field.
  static absl::StatusOr<std::unique_ptr<SimShards>> Create(const SimShardOptions& options,
                                                           const Clock& clock);

  // A server changes state now (the fault plan's kill/restart/stop/cont).
  void Set(uint32_t server, State state);

  // A shard client starting now (a node incarnation): it asks every server at start, so its view
  // begins as the servers' states. Its probes run every probe_interval from a phase keyed by
  // `probe_key` (0: in step with its start), as clients started at different times probe out of
  // step with each other.
  uint32_t NewClient(uint64_t probe_key = 0);

  // The partitions of `table`'s rows (ids beyond the table left out) added to `out`, which is
  // then sorted and distinct. Unknown table: nothing added (the node refuses the request before
  // it fetches).
  void PartitionsOf(uint32_t table, std::span<const uint64_t> rows,
                    std::vector<uint32_t>* out) const;

  struct Fetch {
    absl::Duration waited;  // in failed attempts before the last round (or before the error)
    absl::Status status;    // OK, UNAVAILABLE or DEADLINE_EXCEEDED, with the client's message
    bool failed_over = false;
  };
  // A fetch by `client` of rows in `partitions` of `table`, starting now.
  Fetch Start(uint32_t client, uint32_t table, std::span<const uint32_t> partitions,
              absl::Time deadline);

  struct Counters {
    uint64_t fetches = 0, failovers = 0, unavailable = 0, deadline_exceeded = 0,
             failed_attempts = 0;
  };
  const Counters& counters() const { return counters_; }

 private:
  SimShards(const SimShardOptions& options, shard::ShardMap map, const Clock& clock);
  State StateAt(uint32_t server, absl::Time t) const;
  // Whether `client` believes `server` up at `t`.
  bool BelievesUp(uint32_t client, uint32_t server, absl::Time t) const;

  const shard::ShardClientOptions options_;
  const bool dead_refuses_;
  const shard::ShardMap map_;
  const Clock& clock_;
  struct Table {
    shard::TableLayout layout;
    uint64_t rows = 0;
  };
  absl::flat_hash_map<uint32_t, Table> tables_;                     // by table id
  std::vector<std::vector<std::pair<absl::Time, State>>> history_;  // per server, in time order
  std::vector<std::vector<uint32_t>> servers_of_;                   // per partition
  std::vector<absl::Time> client_start_;  // and its first probe one interval + phase later
  std::vector<absl::Duration> client_phase_;
  // Per client and server: when the client's fetches marked it down (sorted; older than the
  // client's last probe verdict they no longer matter and are dropped).
  absl::flat_hash_map<uint64_t, std::vector<absl::Time>> marks_;
  Counters counters_;
};

}  // namespace hlem::sim
