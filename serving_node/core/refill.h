#pragma once
// Background refill of the EMB cache (ARCHITECTURE §4): after the EMB side won pages (the node
// calls Kick() when the MemoryManager's EMB budget grew), fills the new capacity with the most
// popular rows that are not resident, without getting in the way of live requests' misses.
//
// Plan. Kick() takes every key the PopularitySketch tracks, most popular first, drops the rows
// already resident or pending (EmbCache::Peek), and queues the rest per table. Rows are refilled
// only into slots the cache has free (EmbCache::FreeSlots), so refill never evicts; a table with
// no free slot left is dropped from the plan.
//
// Chunks. Work goes in chunks of at most `chunk_bytes` of one table's rows (a row larger than a
// chunk makes a one-row chunk), exactly one chunk in flight: fetch the rows from the RowSource
// into a staging buffer, reserve their slots (EmbCache::ReserveBatch: pending, so no lookup is
// served before the bytes land), copy them with Device::CopyToPool(kBackground, kEmbRefill) —
// one copy per run of contiguous slots, at most `max_copy_bytes` each —, and when every copy of
// the chunk completed, Commit the rows whose copy succeeded and Abort the others. Fetching before
// reserving means a miss of a live request never waits on a background fetch; a fetch error
// leaves nothing reserved.
//
// Throttle. A chunk is issued only while Device::critical_pending() is false and a token bucket
// (`bytes_per_second`, `burst_bytes`) holds the chunk's bytes, so refill plus miss traffic stays
// under the link budget. A critical copy submitted while a chunk is on the link waits for at most
// the background copy on the link (<= one chunk): the link serves critical copies first.
//
// Driving. Everything runs in Clock timers: a tick every `poll_interval` while work remains and
// the throttle says wait, and one right after each chunk completes. The RowSource fetch runs in
// that timer (it blocks the clock's timer thread on a RealClock: the serving node gives the
// Refiller a clock of its own for this, so that its link completions never wait behind a fetch or
// a plan; docs/node.md, "Background clock"). Cancel() (α shrank again)
// issues no new chunk; the chunk in flight finishes (commits or aborts) normally.
//
// Ownership: borrows the cache, device, row source, sketch and clock; the cache and the device
// must outlive every chunk in flight (a chunk's buffers live until its last copy completes, also
// past the Refiller's destruction). Thread-safe.

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "serving_node/core/device.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/popularity.h"
#include "serving_node/core/row_source.h"

namespace hlem::serving {

struct RefillOptions {
  uint64_t chunk_bytes = 1 << 20;     // at most this much per chunk (ARCHITECTURE §4: 1 MiB)
  uint64_t max_copy_bytes = 1 << 20;  // largest single device copy; <= chunk_bytes matters
  double bytes_per_second = 4e9;      // token rate; leave the link room for misses
  uint64_t burst_bytes = 2 << 20;     // bucket depth; must hold one chunk
  absl::Duration poll_interval = absl::Microseconds(200);
  absl::Duration fetch_timeout = absl::Seconds(1);  // deadline of one RowSource fetch
};

struct RefillStats {
  uint64_t kicks = 0;
  uint64_t rows_refilled = 0;  // committed
  uint64_t bytes_refilled = 0;
  uint64_t chunks = 0;             // completed (committed at least in part)
  uint64_t chunks_failed = 0;      // fetch or copy failures
  uint64_t rows_aborted = 0;       // reserved, then aborted after a failed copy
  uint64_t backlog_rows = 0;       // planned rows not yet issued (now)
  uint64_t deferred_critical = 0;  // ticks that waited for critical copies
  uint64_t deferred_rate = 0;      // ticks that waited for tokens
  bool in_flight = false;          // a chunk is being copied (now)
  bool cancelled = false;          // the last plan was cancelled
  bool done = true;                // no plan left or pending and nothing in flight
};

class Refiller {
 public:
  // INVALID_ARGUMENT (naming the field) for a zero chunk or copy size, a non-positive rate, a
  // burst smaller than a chunk, or a non-positive poll interval.
  static absl::StatusOr<std::unique_ptr<Refiller>> Create(const RefillOptions& options,
                                                          EmbCache& cache, Device& device,
                                                          RowSource& source,
                                                          PopularitySketch& sketch, Clock& clock);
  ~Refiller();
  Refiller(const Refiller&) = delete;
  Refiller& operator=(const Refiller&) = delete;

  // Plans anew from the sketch and starts (or continues) refilling. Clears a cancellation. The
  // plan (the sketch's top rows, each looked up in the cache) is made in a timer on the
  // Refiller's clock, not on the caller's thread: the node kicks from its own timers, which must
  // not wait on it.
  void Kick();
  // Stops issuing chunks and drops the plan; the chunk in flight completes normally.
  void Cancel();

  RefillStats GetStats() const;

 private:
  struct Chunk;
  struct Life;  // lets timers and completions outlive the Refiller safely
  struct Queue {
    uint32_t table_id;
    std::deque<PopularRow> rows;  // most popular first
  };

  Refiller(const RefillOptions& options, EmbCache& cache, Device& device, RowSource& source,
           PopularitySketch& sketch, Clock& clock);
  // Makes the plan of the Kick numbered `gen` (a later Kick or a Cancel voids it).
  void Plan(uint64_t gen);
  // Runs the tick scheduled as `gen` (older timers are ignored).
  void Tick(uint64_t gen);
  void ScheduleTickLocked(absl::Duration delay) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the next chunk's rows off the plan (all of one table); empty when the plan is done.
  std::vector<uint64_t> NextRowsLocked(uint32_t* table_id, uint32_t* row_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefillTokensLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves and copies a fetched chunk; false when nothing was issued.
  bool IssueCopies(const std::shared_ptr<Chunk>& chunk);
  static void FinishChunk(const std::shared_ptr<Chunk>& chunk);
  void ChunkDone(uint64_t rows, uint64_t bytes, uint64_t aborted, bool failed);
  uint64_t BacklogLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const RefillOptions options_;
  EmbCache& cache_;
  Device& device_;
  RowSource& source_;
  PopularitySketch& sketch_;
  Clock& clock_;
  std::shared_ptr<Life> life_;

  mutable absl::Mutex mu_;
  std::vector<Queue> plan_ ABSL_GUARDED_BY(mu_);
  double tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time tokens_at_ ABSL_GUARDED_BY(mu_);
  bool timer_set_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t tick_gen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t kick_gen_ ABSL_GUARDED_BY(mu_) = 0;
  bool plan_pending_ ABSL_GUARDED_BY(mu_) = false;  // a Kick whose plan is not made yet
  TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;
  RefillStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::serving
