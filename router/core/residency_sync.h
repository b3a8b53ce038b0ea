#pragma once
// Keeps the router's view of one node exact (ARCHITECTURE §6): reads the node's residency stream
// into the Cluster and resynchronises on every break, with the transport behind a small interface
// (the gRPC client in router/service implements it; tests use a scripted fake).
//
// One Step():
//   - no view yet, a new epoch, or a stream the node refused with FAILED_PRECONDITION (events no
//     longer retained, another epoch): take a Snapshot, Reset the node's view from it, and stream
//     from snapshot.seq + 1;
//   - otherwise stream from the last applied seq + 1 (a replay after a gap, or a reconnect);
//   - a gap inside the stream (Cluster::Apply says FAILED_PRECONDITION) ends the stream; the next
//     Step replays from the last applied seq + 1 (same epoch) or snapshots (new epoch);
//   - the node unreachable (UNAVAILABLE, DEADLINE_EXCEEDED, ...): the view is marked unreachable
//     and the next Step starts over with a snapshot after `retry_backoff`.
// Run() repeats Step until Stop(). Counters say what happened (replays, snapshots, failures).
// Thread-safe: Stop() may be called from any thread; Step/Run from one.

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "router/core/cluster.h"
#include "serving_node/core/residency_events.h"
#include "serving_node/core/residency_state.h"

namespace hlem::router {

// The transport to one node's residency feed.
class ResidencyFeed {
 public:
  virtual ~ResidencyFeed() = default;
  // Streams events of `epoch` (0: the current one) from `from_seq`, calling on_batch(epoch,
  // events) per message until on_batch returns false, Cancel() is called or the stream ends;
  // returns the stream's final status (OK when on_batch stopped it or it was cancelled).
  virtual absl::Status Stream(
      uint64_t epoch, uint64_t from_seq,
      const std::function<bool(uint64_t epoch, const std::vector<serving::ResidencyEvent>&)>&
          on_batch) = 0;
  virtual absl::StatusOr<serving::ResidencySnapshot> Snapshot() = 0;
  // Ends a Stream in progress (from another thread).
  virtual void Cancel() = 0;
};

struct ResidencySyncStats {
  uint64_t streams = 0, snapshots = 0, replays = 0, failures = 0, events = 0;
};

class ResidencySync {
 public:
  // Borrows everything; `node` is the cluster's index of the node.
  ResidencySync(Cluster& cluster, int node, ResidencyFeed& feed, Clock& clock,
                absl::Duration retry_backoff = absl::Milliseconds(500))
      : cluster_(cluster), node_(node), feed_(feed), clock_(clock), backoff_(retry_backoff) {}

  // One snapshot or stream attempt (blocks while the stream runs).
  void Step();
  // Step until Stop().
  void Run();
  void Stop();

  ResidencySyncStats stats() const;

 private:
  Cluster& cluster_;
  const int node_;
  ResidencyFeed& feed_;
  Clock& clock_;
  const absl::Duration backoff_;
  std::atomic<bool> stopping_{false};

  mutable absl::Mutex mu_;
  bool need_snapshot_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;  // back off before the next attempt
  ResidencySyncStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::router
