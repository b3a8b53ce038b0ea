#pragma once
// Owns the split of one HbmPool between the KV cache and the EMB cache (ARCHITECTURE §4).
//
// α is the EMB share of the pool's pages. SetAlpha only moves budgets and page ownership: no
// resident KV byte is ever copied.
//   - α down: the EMB cache sheds its coldest pages at once (metadata: lazy invalidation), and
//     the KV budget grows by the same number of pages.
//   - α up: the KV budget shrinks at once (the KV side stops growing into the EMB share); the EMB
//     side takes free pages first; pages the KV side still holds beyond its budget are reclaimed
//     from idle least-recently-used unpinned users (whole users or tail pages) by Step(), at most
//     `reclaim_pages_per_step` per step, so a burst of α changes cannot stall request threads.
// Effective α is what the EMB side can use right now: min(target, held + free) / pages. The
// change converges when effective α equals the target; its duration is recorded.
//
// Step() runs on a Clock timer every `step_interval` (Start/Stop) or is called directly by the
// simulator. Thread-safe.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"

namespace hlem::serving {

struct MemoryManagerOptions {
  double initial_alpha = 0.5;
  uint32_t reclaim_pages_per_step = 256;  // bounded reclaim rate (pages per step)
  uint32_t reclaim_users_per_step = 64;
  absl::Duration step_interval = absl::Milliseconds(10);
  // Pending residency counts of shrunk EMB pages subtracted per Step (EmbCache::DrainPending),
  // in batches of 4096 so no lookup waits long behind one.
  uint32_t drain_items_per_step = 32768;
};

struct MemoryState {
  double target_alpha = 0;
  double effective_alpha = 0;
  uint32_t pages = 0;
  uint32_t emb_budget_pages = 0;
  uint32_t kv_budget_pages = 0;
  uint32_t emb_pages = 0;  // held by the EMB cache
  uint32_t kv_pages = 0;   // held by the KV cache
  uint32_t free_pages = 0;
  bool converged = true;
  uint64_t alpha_epoch = 0;
  uint64_t alpha_changes = 0;
  uint64_t pages_reclaimed = 0;  // from the KV side, for the EMB side (cumulative)
  uint64_t pages_shrunk = 0;     // from the EMB side, for the KV side (cumulative)
  absl::Duration last_convergence = absl::ZeroDuration();  // of the last completed change
};

class MemoryManager {
 public:
  static absl::StatusOr<std::unique_ptr<MemoryManager>> Create(const MemoryManagerOptions& options,
                                                               HbmPool& pool, KvCache& kv,
                                                               EmbCache& emb, Clock& clock);
  ~MemoryManager();

  // Moves the target. INVALID_ARGUMENT for α outside [0, 1] (or NaN); FAILED_PRECONDITION for an
  // epoch older than the last one applied (the allocator's pushes are ordered by epoch; an equal
  // epoch re-applies). Returns the state right after the metadata change.
  absl::StatusOr<MemoryState> SetAlpha(double alpha, uint64_t epoch);
  // One bounded reclaim step toward the target; returns the pages moved.
  uint32_t Step();
  // Runs Step() every step_interval on the clock until Stop() (or destruction).
  void Start();
  void Stop();

  MemoryState State() const;

 private:
  MemoryManager(const MemoryManagerOptions& options, HbmPool& pool, KvCache& kv, EmbCache& emb,
                Clock& clock);
  uint32_t TargetEmbPages(double alpha) const;
  // Gives the EMB side what it may use now and records convergence.
  void UpdateBudgetsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  MemoryState StateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleStep();

  const MemoryManagerOptions options_;
  HbmPool& pool_;
  KvCache& kv_;
  EmbCache& emb_;
  Clock& clock_;

  mutable absl::Mutex mu_;
  double target_alpha_ ABSL_GUARDED_BY(mu_);
  uint32_t target_emb_pages_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reclaimed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t shrunk_ ABSL_GUARDED_BY(mu_) = 0;
  bool converged_ ABSL_GUARDED_BY(mu_) = true;
  absl::Time change_started_ ABSL_GUARDED_BY(mu_);
  absl::Duration last_convergence_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  TimerId timer_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<int> step_token_ = std::make_shared<int>(0);
  absl::Mutex step_mu_;  // one Step at a time
};

}  // namespace hlem::serving
