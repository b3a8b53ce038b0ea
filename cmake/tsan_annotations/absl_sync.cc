// TSan builds of the service shells only (the `tsan-services` preset, scripts/tsan-services.sh):
// happens-before annotations for Debian's absl synchronization, preloaded (LD_PRELOAD) into the
// tests. Debian's libabsl_synchronization is not built with TSan, and gRPC 1.51 locks with
// absl::Mutex, so a TSan build over them sees neither our locking nor gRPC's: every guarded
// access looks like a race. The core libraries' TSan stage swaps in a header stand-in
// (cmake/tsan/absl/synchronization/mutex.h), which cannot change what the prebuilt gRPC calls.
// This library interposes the out-of-line functions instead (our code and libgrpc reach them
// through the dynamic linker, and a preloaded library comes first), forwards each to libabsl's
// own, and tells TSan what it did: a lock acquires the mutex's address, an unlock releases it,
// a wait releases and then acquires. Conditions (Await, LockWhen) may be evaluated by whichever
// thread holds the lock at the time, so each is wrapped to acquire before and release after its
// evaluation. Annotations are acquire/release (not TSan's mutex model): they add exactly the
// edges the real locks make and no lock-order checking.
#include <sanitizer/tsan_interface.h>

#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cmake/tsan_annotations/next.h"

namespace {

// libabsl's definition of the function whose mangled name is "_ZN" (or "_ZNK" for const
// members) "4absl" <inline namespace> `rest`.
template <typename F>
F Next(bool is_const, const char* rest) {
  const std::string name =
      std::string(is_const ? "_ZNK" : "_ZN") + hlem::tsan::MangledAbsl() + rest;
  return hlem::tsan::Next<F>(name.c_str());
}

// A condition evaluated under the mutex, by the waiter or by the thread unlocking.
struct Annotated {
  const absl::Condition* cond;
  void* mu;
};
bool EvalAnnotated(Annotated* a) {
  __tsan_acquire(a->mu);
  const bool result = a->cond->Eval();
  __tsan_release(a->mu);
  return result;
}

}  // namespace

#define HLEM_NEXT(is_const, rest, ...) static const auto next = Next<__VA_ARGS__>(is_const, rest)

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  HLEM_NEXT(false, "5Mutex4LockEv", void (*)(Mutex*));
  next(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  HLEM_NEXT(false, "5Mutex10ReaderLockEv", void (*)(Mutex*));
  next(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  HLEM_NEXT(false, "5Mutex7TryLockEv", bool (*)(Mutex*));
  const bool locked = next(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  HLEM_NEXT(false, "5Mutex13ReaderTryLockEv", bool (*)(Mutex*));
  const bool locked = next(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Unlock() {
  HLEM_NEXT(false, "5Mutex6UnlockEv", void (*)(Mutex*));
  __tsan_release(this);
  next(this);
}

void Mutex::ReaderUnlock() {
  HLEM_NEXT(false, "5Mutex12ReaderUnlockEv", void (*)(Mutex*));
  __tsan_release(this);
  next(this);
}

void Mutex::Await(const Condition& cond) {
  HLEM_NEXT(false, "5Mutex5AwaitERKNS0_9ConditionE", void (*)(Mutex*, const Condition&));
  Annotated a{&cond, this};
  __tsan_release(this);
  next(this, Condition(&EvalAnnotated, &a));
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  HLEM_NEXT(false, "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE",
            bool (*)(Mutex*, const Condition&, Duration));
  Annotated a{&cond, this};
  __tsan_release(this);
  const bool met = next(this, Condition(&EvalAnnotated, &a), timeout);
  __tsan_acquire(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  HLEM_NEXT(false, "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
            bool (*)(Mutex*, const Condition&, Time));
  Annotated a{&cond, this};
  __tsan_release(this);
  const bool met = next(this, Condition(&EvalAnnotated, &a), deadline);
  __tsan_acquire(this);
  return met;
}

void Mutex::LockWhen(const Condition& cond) {
  HLEM_NEXT(false, "5Mutex8LockWhenERKNS0_9ConditionE", void (*)(Mutex*, const Condition&));
  Annotated a{&cond, this};
  next(this, Condition(&EvalAnnotated, &a));
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  HLEM_NEXT(false, "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
            bool (*)(Mutex*, const Condition&, Duration));
  Annotated a{&cond, this};
  const bool met = next(this, Condition(&EvalAnnotated, &a), timeout);
  __tsan_acquire(this);
  return met;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  HLEM_NEXT(false, "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
            bool (*)(Mutex*, const Condition&, Time));
  Annotated a{&cond, this};
  const bool met = next(this, Condition(&EvalAnnotated, &a), deadline);
  __tsan_acquire(this);
  return met;
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  HLEM_NEXT(false, "5Mutex14ReaderLockWhenERKNS0_9ConditionE", void (*)(Mutex*, const Condition&));
  Annotated a{&cond, this};
  next(this, Condition(&EvalAnnotated, &a));
  __tsan_acquire(this);
}

void CondVar::Wait(Mutex* mu) {
  HLEM_NEXT(false, "7CondVar4WaitEPNS0_5MutexE", void (*)(CondVar*, Mutex*));
  __tsan_release(mu);
  next(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  HLEM_NEXT(false, "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE",
            bool (*)(CondVar*, Mutex*, Duration));
  __tsan_release(mu);
  const bool timed_out = next(this, mu, timeout);
  __tsan_acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  HLEM_NEXT(false, "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE",
            bool (*)(CondVar*, Mutex*, Time));
  __tsan_release(mu);
  const bool timed_out = next(this, mu, deadline);
  __tsan_acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  HLEM_NEXT(false, "12Notification6NotifyEv", void (*)(Notification*));
  __tsan_release(this);
  next(this);
}

void Notification::WaitForNotification() const {
  HLEM_NEXT(true, "12Notification19WaitForNotificationEv", void (*)(const Notification*));
  next(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  HLEM_NEXT(true, "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE",
            bool (*)(const Notification*, Duration));
  const bool notified = next(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  HLEM_NEXT(true, "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE",
            bool (*)(const Notification*, Time));
  const bool notified = next(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
