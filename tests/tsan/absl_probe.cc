// Checks the absl annotations of TSan builds (cmake/tsan_annotations/absl_sync.cc): run under
// HLEM_TSAN_ANNOTATIONS with the annotations preloaded.
//   absl_probe guarded: data handed between threads only through absl's Mutex (Lock, LockWhen,
//     Await), CondVar and Notification; TSan must report nothing (without the annotations it
//     reports each hand-off).
//   absl_probe race: one unguarded counter beside a guarded one; TSan must report the race (the
//     annotations must not hide real ones).
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

absl::Mutex mu;
int guarded = 0;
int unguarded = 0;
int queued = 0;
int slots[64];

int Guarded(bool race) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([race] {
      for (int k = 0; k < 1000; ++k) {
        absl::MutexLock lock(&mu);
        ++guarded;
      }
      if (race) ++unguarded;
    });
  }
  for (std::thread& t : threads) t.join();

  // A queue: the producer fills a slot and counts it under the lock; the consumer waits for the
  // count with LockWhen (the condition may be evaluated by the producer's unlock).
  std::thread producer([] {
    for (int i = 0; i < 64; ++i) {
      absl::MutexLock lock(&mu);
      slots[i] = i;
      ++queued;
    }
  });
  int sum = 0;
  for (int i = 0; i < 64; ++i) {
    mu.LockWhen(absl::Condition(
        +[](int* n) { return *n > 0; }, &queued));
    --queued;
    sum += slots[i];
    mu.Unlock();
  }
  producer.join();

  // A condition variable and an Await.
  absl::CondVar cv;
  bool ready = false;
  int payload = 0;
  std::thread signaller([&] {
    absl::MutexLock lock(&mu);
    payload = 5;
    ready = true;
    cv.Signal();
  });
  {
    absl::MutexLock lock(&mu);
    while (!ready) cv.Wait(&mu);
    payload += 1;
    mu.Await(absl::Condition(&ready));
  }
  signaller.join();

  // A notification.
  int handed = 0;
  absl::Notification note;
  std::thread waiter([&] {
    note.WaitForNotification();
    handed += 1;
  });
  handed = 41;
  note.Notify();
  waiter.join();

  const bool ok = guarded == 4000 && sum == 64 * 63 / 2 && payload == 6 && handed == 42;
  std::printf("absl_probe: %s\n", ok ? "values as expected" : "WRONG VALUES");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || (std::strcmp(argv[1], "guarded") != 0 && std::strcmp(argv[1], "race") != 0)) {
    std::fprintf(stderr, "usage: absl_probe guarded|race\n");
    return 2;
  }
  return Guarded(std::strcmp(argv[1], "race") == 0);
}
