#include "serving_node/core/request_queue.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/shed.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<RequestQueue>> RequestQueue::Create(
    const RequestQueueOptions& options, Pipeline& pipeline, Clock& clock) {
  if (options.max_batch == 0) return absl::InvalidArgumentError("queue.max_batch: must be > 0");
  if (options.max_queue == 0) return absl::InvalidArgumentError("queue.max_queue: must be > 0");
  if (options.workers <= 0) return absl::InvalidArgumentError("queue.workers: must be > 0");
  if (options.batch_window < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("queue.batch_window: must not be negative");
  }
  if (options.max_delay <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("queue.max_delay: must be > 0");
  }
  return std::unique_ptr<RequestQueue>(new RequestQueue(options, pipeline, clock));
}

RequestQueue::RequestQueue(const RequestQueueOptions& options, Pipeline& pipeline, Clock& clock)
    : options_(options), pipeline_(pipeline), clock_(clock) {
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

RequestQueue::~RequestQueue() {
  Drain();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void RequestQueue::Submit(InferInput in, Done done) {
  absl::Status rejected;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.submitted;
    const absl::Time now = clock_.Now();
    if (draining_) {
      ++stats_.rejected_draining;
      rejected = absl::UnavailableError("the node is draining");
    } else if (queue_.size() >= options_.max_queue) {
      ++stats_.rejected_overload;
      rejected = absl::ResourceExhaustedError(
          absl::StrCat("the node's queue is full (", options_.max_queue, " requests)"));
    } else if (!queue_.empty() && now - queue_.front().enqueued > options_.max_delay) {
      ++stats_.rejected_overload;
      ++stats_.rejected_delay;
      rejected = absl::ResourceExhaustedError(
          absl::StrCat("the node's queue is behind: its oldest request has waited ",
                       absl::FormatDuration(now - queue_.front().enqueued), " (max_delay ",
                       absl::FormatDuration(options_.max_delay), ")"));
    } else {
      // Inter-arrival gap, smoothed over the last few requests (adaptive batch window).
      if (last_arrival_ != absl::InfinitePast()) {
        const absl::Duration gap = now - last_arrival_;
        gap_ewma_ = gap_ewma_ == absl::InfiniteDuration() ? gap : gap_ewma_ * 0.75 + gap * 0.25;
      }
      last_arrival_ = now;
      queue_.push_back(Item{std::move(in), std::move(done), now});
      return;
    }
  }
  done(rejected);  // outside the lock: the callback may submit again
}

absl::StatusOr<InferOutput> RequestQueue::Infer(InferInput in) {
  // Shared with the callback, which may still be unlocking when the waiter returns. (absl::Mutex
  // rather than absl::Notification: the TSan build replaces only the former.)
  struct Answer {
    absl::Mutex mu;
    bool ready ABSL_GUARDED_BY(mu) = false;
    absl::StatusOr<InferOutput> result ABSL_GUARDED_BY(mu);
  };
  auto answer = std::make_shared<Answer>();
  Submit(std::move(in), [answer](absl::StatusOr<InferOutput> r) {
    absl::MutexLock lock(&answer->mu);
    answer->result = std::move(r);
    answer->ready = true;
  });
  absl::MutexLock lock(&answer->mu);
  answer->mu.Await(absl::Condition(&answer->ready));
  return std::move(answer->result);
}

void RequestQueue::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return queue_.empty() && running_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

RequestQueueStats RequestQueue::stats() const {
  absl::MutexLock lock(&mu_);
  RequestQueueStats s = stats_;
  s.depth = queue_.size();
  return s;
}

void RequestQueue::WorkerLoop() {
  while (true) {
    std::vector<Item> batch;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&work));
      if (queue_.empty()) return;  // stopping with nothing left
      // Give the batch a moment to fill, unless it is full already or the node drains.
      auto full = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return queue_.size() >= options_.max_batch || draining_ || stopping_;
      };
      // Adaptive: wait only when requests arrive often enough for another one to be expected
      // within the window; a lone request at low load runs at once.
      const bool expect_more = !options_.adaptive_window || gap_ewma_ < options_.batch_window;
      if (options_.batch_window > absl::ZeroDuration() && expect_more && !full()) {
        ++stats_.windows_waited;
        mu_.AwaitWithTimeout(absl::Condition(&full), options_.batch_window);
      }
      while (!queue_.empty() && batch.size() < options_.max_batch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      if (batch.empty()) continue;  // another worker took them
      running_ += batch.size();
    }
    // Requests that expired while queued are answered without compute, and so are those that
    // waited longer than max_delay (shed late rather than served late).
    const absl::Time now = clock_.Now();
    std::vector<InferInput> inputs;
    std::vector<size_t> live, expired, late;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (now >= batch[i].in.deadline) {
        expired.push_back(i);
      } else if (now - batch[i].enqueued > options_.max_delay) {
        late.push_back(i);
      } else {
        inputs.push_back(std::move(batch[i].in));
        live.push_back(i);
      }
    }
    {
      // Counted before any answer goes out: a caller that has its answer sees it in stats().
      absl::MutexLock lock(&mu_);
      stats_.expired += expired.size();
      stats_.rejected_overload += late.size();
      stats_.shed_late += late.size();
      if (!inputs.empty()) {
        ++stats_.batches;
        stats_.batched_requests += inputs.size();
      }
    }
    for (size_t i : expired) {
      batch[i].done(absl::DeadlineExceededError("deadline passed while queued"));
    }
    for (size_t i : late) {
      batch[i].done(ShedLateError(absl::StrCat(
          "the node is overloaded: waited ", absl::FormatDuration(now - batch[i].enqueued),
          " in its queue (max_delay ", absl::FormatDuration(options_.max_delay), ")")));
    }
    if (!inputs.empty()) {
      if (options_.on_batch) options_.on_batch(inputs.size());
      std::vector<absl::StatusOr<InferOutput>> results;
      try {
        results = pipeline_.InferBatch(inputs);
      } catch (const std::exception& e) {
        // InferBatch turns the runner's exceptions into statuses; anything else thrown still
        // gets every request of the batch its one answer.
        results.assign(inputs.size(),
                       absl::InternalError(absl::StrCat("the node's pipeline threw: ", e.what())));
      }
      for (size_t k = 0; k < live.size(); ++k) batch[live[k]].done(std::move(results[k]));
    }
    absl::MutexLock lock(&mu_);
    running_ -= batch.size();
  }
}

}  // namespace hlem::serving
