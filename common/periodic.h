#pragma once
// Runs a function on its own thread now and then every `interval` until destroyed (e.g. metrics
// refreshes in a binary's main). The destructor stops the thread and waits for a call in progress.

#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hlem {

class PeriodicThread {
 public:
  PeriodicThread(absl::Duration interval, std::function<void()> fn)
      : thread_([this, interval, fn = std::move(fn)] {
          absl::MutexLock lock(&mu_);
          auto stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
          do {
            fn();
          } while (!mu_.AwaitWithTimeout(absl::Condition(&stopped), interval));
        }) {}
  ~PeriodicThread() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after mu_ and stopping_ exist
};

}  // namespace hlem
