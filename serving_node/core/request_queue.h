#pragma once
// The queue in front of the node pipeline (issue 4): requests that arrive together are run as one
// Pipeline::InferBatch. A worker takes the oldest request, waits up to `batch_window` for more (or
// until `max_batch` are there; only while requests arrive that often: adaptive_window), and runs
// them; requests whose deadline passed while queued are
// answered DEADLINE_EXCEEDED without compute. A full queue answers RESOURCE_EXHAUSTED at once,
// and so does a queue whose oldest request has waited longer than `max_delay`; a request that
// waited longer than that is answered RESOURCE_EXHAUSTED when its turn comes, without compute (the
// queue bounded in time, not only in length: under overload the served requests keep their
// latency);
// after Drain every new request is answered UNAVAILABLE and the admitted ones still finish. Every
// submitted request gets exactly one answer.
//
// Thread-safe. Workers are threads of this queue; `done` callbacks run on them (or inline for a
// request rejected at submission) and must not block for long.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "serving_node/core/pipeline.h"

namespace hlem::serving {

struct RequestQueueOptions {
  uint32_t max_batch = 16;   // requests per model call
  uint32_t max_queue = 256;  // waiting requests; beyond: overload
  // Beyond it (the oldest waiting request's wait), new requests are refused: overload.
  absl::Duration max_delay = absl::InfiniteDuration();
  absl::Duration batch_window = absl::Milliseconds(1);  // how long a batch waits to fill
  // Wait for the batch to fill only while requests arrive less than batch_window apart (smoothed
  // inter-arrival gap); at low load a request runs at once instead of waiting the window out.
  bool adaptive_window = true;
  int workers = 1;  // concurrent batches
  // Called with the size of every batch run through the model (metrics). Optional.
  std::function<void(size_t)> on_batch;
};

struct RequestQueueStats {
  uint64_t submitted = 0;
  uint64_t rejected_overload = 0;  // RESOURCE_EXHAUSTED at submission (either limit)
  uint64_t rejected_delay = 0;     // of which at submission for max_delay
  uint64_t shed_late = 0;          // of which taken from the queue after waiting over max_delay
  uint64_t rejected_draining = 0;  // UNAVAILABLE at submission
  uint64_t expired = 0;            // DEADLINE_EXCEEDED while queued
  uint64_t batches = 0;
  uint64_t batched_requests = 0;  // requests run in those batches
  uint64_t windows_waited = 0;    // batches that waited for the batch window
  uint64_t depth = 0;             // now
};

class RequestQueue {
 public:
  using Done = std::function<void(absl::StatusOr<InferOutput>)>;

  // INVALID_ARGUMENT (naming the field) for a zero max_batch, max_queue or workers, or a negative
  // batch window. The pipeline and the clock are borrowed.
  static absl::StatusOr<std::unique_ptr<RequestQueue>> Create(const RequestQueueOptions& options,
                                                              Pipeline& pipeline, Clock& clock);
  ~RequestQueue();  // Drain, then stops the workers

  // Queues a request; `done` runs exactly once with its answer.
  void Submit(InferInput in, Done done);
  // Submit and wait for the answer.
  absl::StatusOr<InferOutput> Infer(InferInput in);
  // Stops admitting (new requests: UNAVAILABLE) and waits until every admitted request has been
  // answered. Idempotent.
  void Drain();

  RequestQueueStats stats() const;

 private:
  struct Item {
    InferInput in;
    Done done;
    absl::Time enqueued;
  };
  RequestQueue(const RequestQueueOptions& options, Pipeline& pipeline, Clock& clock);
  void WorkerLoop();

  const RequestQueueOptions options_;
  Pipeline& pipeline_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t running_ ABSL_GUARDED_BY(mu_) = 0;  // admitted requests taken by a worker
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  RequestQueueStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Time last_arrival_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration gap_ewma_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
  std::vector<std::thread> workers_;
};

}  // namespace hlem::serving
