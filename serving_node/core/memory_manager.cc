#include "serving_node/core/memory_manager.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<MemoryManager>> MemoryManager::Create(
    const MemoryManagerOptions& options, HbmPool& pool, KvCache& kv, EmbCache& emb, Clock& clock) {
  if (!(options.initial_alpha >= 0 && options.initial_alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory.initial_alpha: must be in [0, 1], got ", options.initial_alpha));
  }
  if (options.reclaim_pages_per_step == 0 || options.reclaim_users_per_step == 0) {
    return absl::InvalidArgumentError("memory.reclaim_*_per_step: must be > 0");
  }
  if (options.step_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("memory.step_interval: must be > 0");
  }
  std::unique_ptr<MemoryManager> m(new MemoryManager(options, pool, kv, emb, clock));
  absl::MutexLock lock(&m->mu_);
  m->UpdateBudgetsLocked();
  return m;
}

MemoryManager::MemoryManager(const MemoryManagerOptions& options, HbmPool& pool, KvCache& kv,
                             EmbCache& emb, Clock& clock)
    : options_(options),
      pool_(pool),
      kv_(kv),
      emb_(emb),
      clock_(clock),
      target_alpha_(options.initial_alpha),
      target_emb_pages_(TargetEmbPages(options.initial_alpha)),
      change_started_(clock.Now()) {}

MemoryManager::~MemoryManager() {
  Stop();
  std::weak_ptr<int> token = step_token_;
  absl::MutexLock lock(&mu_);
  step_token_.reset();
  auto idle = [&token] { return token.expired(); };
  mu_.Await(absl::Condition(&idle));
}

uint32_t MemoryManager::TargetEmbPages(double alpha) const {
  return static_cast<uint32_t>(std::llround(alpha * pool_.num_pages()));
}

absl::StatusOr<MemoryState> MemoryManager::SetAlpha(double alpha, uint64_t epoch) {
  if (!(alpha >= 0 && alpha <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("alpha: must be in [0, 1], got ", alpha));
  }
  absl::MutexLock lock(&mu_);
  if (epoch < epoch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("alpha epoch ", epoch, " is older than the applied epoch ", epoch_));
  }
  epoch_ = epoch;
  const uint32_t target = TargetEmbPages(alpha);
  target_alpha_ = alpha;
  if (target != target_emb_pages_) {
    ++changes_;
    change_started_ = clock_.Now();
    converged_ = false;
  }
  target_emb_pages_ = target;
  UpdateBudgetsLocked();
  return StateLocked();
}

void MemoryManager::UpdateBudgetsLocked() {
  const uint32_t n = pool_.num_pages();
  const uint32_t target = target_emb_pages_;
  // α down: shed the EMB side's coldest pages now (metadata only) so KV can take them.
  std::vector<PageId> freed;
  if (emb_.budget_pages() > target || pool_.pages_owned(PageOwner::kEmb) > target) {
    emb_.SetBudgetPages(target, &freed);
    shrunk_ += freed.size();
  }
  // The KV side may never grow into the EMB target.
  kv_.SetBudgetPages(n - target);
  // The EMB side may use what it holds plus what is free, up to the target.
  const uint32_t emb_held = pool_.pages_owned(PageOwner::kEmb);
  const uint32_t usable = std::min(target, emb_held + pool_.free_pages());
  emb_.SetBudgetPages(usable);
  if (!converged_ && usable == target) {
    converged_ = true;
    last_convergence_ = clock_.Now() - change_started_;
  }
}

uint32_t MemoryManager::Step() {
  absl::MutexLock step_lock(&step_mu_);
  uint32_t want = 0;
  {
    absl::MutexLock lock(&mu_);
    const uint32_t emb_held = pool_.pages_owned(PageOwner::kEmb);
    const uint32_t free = pool_.free_pages();
    if (emb_held + free < target_emb_pages_) {
      want = std::min(target_emb_pages_ - emb_held - free, options_.reclaim_pages_per_step);
    }
  }
  uint32_t moved = 0;
  if (want > 0) {
    // Outside mu_: Reclaim takes the KV cache's lock (lock order KvCache -> HbmPool).
    std::vector<PageId> pages = kv_.Reclaim(want, options_.reclaim_users_per_step);
    for (PageId p : pages) pool_.FreePage(p);  // the EMB side takes them with AllocPage
    moved = static_cast<uint32_t>(pages.size());
  }
  {
    absl::MutexLock lock(&mu_);
    reclaimed_ += moved;
    UpdateBudgetsLocked();
  }
  // Outside mu_, in short batches: the residency counts an α drop left behind.
  for (uint32_t left = options_.drain_items_per_step; left > 0;) {
    const uint32_t batch = std::min<uint32_t>(left, 4096);
    if (!emb_.DrainPending(batch)) break;
    left -= batch;
  }
  return moved;
}

void MemoryManager::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (running_) return;
    running_ = true;
  }
  ScheduleStep();
}

void MemoryManager::Stop() {
  absl::MutexLock lock(&mu_);
  running_ = false;
  clock_.Cancel(timer_);
}

void MemoryManager::ScheduleStep() {
  absl::MutexLock lock(&mu_);
  if (!running_ || step_token_ == nullptr) return;
  std::weak_ptr<int> weak = step_token_;
  timer_ = clock_.ScheduleAfter(options_.step_interval, [this, weak] {
    std::shared_ptr<int> token = weak.lock();
    if (!token) return;
    Step();
    ScheduleStep();
    absl::MutexLock lock(&mu_);
    token.reset();  // under mu_ so the destructor's Await sees it
  });
}

MemoryState MemoryManager::State() const {
  absl::MutexLock lock(&mu_);
  return StateLocked();
}

MemoryState MemoryManager::StateLocked() const {
  MemoryState s;
  s.pages = pool_.num_pages();
  s.target_alpha = target_alpha_;
  s.emb_pages = pool_.pages_owned(PageOwner::kEmb);
  s.kv_pages = pool_.pages_owned(PageOwner::kKv);
  s.free_pages = pool_.free_pages();
  s.emb_budget_pages = emb_.budget_pages();
  s.kv_budget_pages = kv_.budget_pages();
  s.effective_alpha =
      static_cast<double>(std::min(target_emb_pages_, s.emb_pages + s.free_pages)) / s.pages;
  s.converged = converged_;
  s.alpha_epoch = epoch_;
  s.alpha_changes = changes_;
  s.pages_reclaimed = reclaimed_;
  s.pages_shrunk = shrunk_;
  s.last_convergence = last_convergence_;
  return s;
}

}  // namespace hlem::serving
