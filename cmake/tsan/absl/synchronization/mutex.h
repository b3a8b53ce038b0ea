// TSan builds only (the `tsan` preset puts this directory first on the include path): a stand-in
// for absl::Mutex over std::mutex. Debian's libabsl_synchronization is not built with TSan, so
// TSan cannot see absl::Mutex's locking and reports every guarded access as a race; over
// std::mutex (intercepted by TSan) it sees the happens-before edges. Covers what HLEM's core code
// uses: Lock/Unlock, MutexLock, Await, AwaitWithDeadline and AwaitWithTimeout with a Condition.
// Core-only builds do not link gRPC, whose uninstrumented absl::Mutex users would mismatch this
// definition.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <type_traits>
#include "absl/base/config.h"
#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
namespace absl {
ABSL_NAMESPACE_BEGIN
class Condition {
 public:
  explicit Condition(const bool* b) : fn_([b] { return *b; }) {}
  template <typename T, typename = std::enable_if_t<!std::is_same_v<T, bool>>>
  explicit Condition(const T* obj) : fn_([obj] { return (*obj)(); }) {}
  template <typename T>
  Condition(bool (*f)(T*), T* arg) : fn_([f, arg] { return f(arg); }) {}
  bool Eval() const { return fn_(); }

 private:
  std::function<bool()> fn_;
};
class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Notify before unlocking: once unlocked, a waiter may return and destroy this mutex.
    cv_.notify_all();
    mu_.unlock();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { Lock(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { Unlock(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}
  void Await(const Condition& c) {
    std::unique_lock<std::mutex> l(mu_, std::adopt_lock);
    cv_.notify_all();
    cv_.wait(l, [&] { return c.Eval(); });
    l.release();
  }
  bool AwaitWithDeadline(const Condition& c, absl::Time deadline) {
    std::unique_lock<std::mutex> l(mu_, std::adopt_lock);
    cv_.notify_all();
    bool ok = cv_.wait_until(l, absl::ToChronoTime(deadline), [&] { return c.Eval(); });
    l.release();
    return ok;
  }
  bool AwaitWithTimeout(const Condition& c, absl::Duration timeout) {
    return AwaitWithDeadline(c, absl::Now() + timeout);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }

 private:
  Mutex* mu_;
};
ABSL_NAMESPACE_END
}  // namespace absl
