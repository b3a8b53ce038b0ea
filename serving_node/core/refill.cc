#include "serving_node/core/refill.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace hlem::serving {

// Timers and completions hold this, not the Refiller: after destruction they find no owner.
struct Refiller::Life {
  absl::Mutex mu;
  Refiller* owner ABSL_GUARDED_BY(mu) = nullptr;
};

// One chunk in flight. Lives until its last copy completed (the device reads `staging` until
// then), which may be after the Refiller is gone.
struct Refiller::Chunk {
  EmbCache* cache = nullptr;
  Clock* clock = nullptr;
  std::shared_ptr<Life> life;
  uint32_t table_id = 0;
  uint32_t row_bytes = 0;
  std::vector<uint64_t> rows;         // fetched, in staging order
  std::vector<std::byte> staging;     // rows.size() * row_bytes
  std::vector<uint64_t> reserved;     // rows this chunk reserved
  std::vector<uint32_t> reserved_at;  // their positions in `rows`
  std::vector<uint64_t> offsets;      // their slots
  absl::Mutex mu;
  uint32_t outstanding ABSL_GUARDED_BY(mu) = 0;
  std::vector<bool> failed ABSL_GUARDED_BY(mu);  // per reserved row
};

absl::StatusOr<std::unique_ptr<Refiller>> Refiller::Create(const RefillOptions& options,
                                                           EmbCache& cache, Device& device,
                                                           RowSource& source,
                                                           PopularitySketch& sketch, Clock& clock) {
  if (options.chunk_bytes == 0)
    return absl::InvalidArgumentError("refill.chunk_bytes: must be > 0");
  if (options.max_copy_bytes == 0) {
    return absl::InvalidArgumentError("refill.max_copy_bytes: must be > 0");
  }
  if (!(options.bytes_per_second > 0) || !std::isfinite(options.bytes_per_second)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refill.bytes_per_second: must be a positive number, got ", options.bytes_per_second));
  }
  if (options.burst_bytes < options.chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("refill.burst_bytes: ", options.burst_bytes,
                                                   " cannot hold one chunk of ",
                                                   options.chunk_bytes, " bytes"));
  }
  if (options.poll_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("refill.poll_interval: must be positive");
  }
  return std::unique_ptr<Refiller>(new Refiller(options, cache, device, source, sketch, clock));
}

Refiller::Refiller(const RefillOptions& options, EmbCache& cache, Device& device, RowSource& source,
                   PopularitySketch& sketch, Clock& clock)
    : options_(options),
      cache_(cache),
      device_(device),
      source_(source),
      sketch_(sketch),
      clock_(clock),
      life_(std::make_shared<Life>()) {
  absl::MutexLock life_lock(&life_->mu);
  life_->owner = this;
  absl::MutexLock lock(&mu_);
  tokens_ = static_cast<double>(options.burst_bytes);
  tokens_at_ = clock.Now();
}

Refiller::~Refiller() {
  {
    // Waits for a tick or a chunk completion that is running now.
    absl::MutexLock life_lock(&life_->mu);
    life_->owner = nullptr;
  }
  absl::MutexLock lock(&mu_);
  if (timer_set_) clock_.Cancel(timer_);
}

void Refiller::Kick() {
  absl::MutexLock lock(&mu_);
  const uint64_t gen = ++kick_gen_;
  ++stats_.kicks;
  stats_.cancelled = false;
  plan_pending_ = true;
  clock_.ScheduleAfter(absl::ZeroDuration(), [life = life_, gen] {
    absl::MutexLock life_lock(&life->mu);
    if (life->owner != nullptr) life->owner->Plan(gen);
  });
}

void Refiller::Plan(uint64_t gen) {
  {
    absl::MutexLock lock(&mu_);
    if (gen != kick_gen_ || stats_.cancelled) return;  // a later Kick plans, or none is wanted
  }
  // Plan outside the lock: TopK copies the sketch, Peek takes the cache's lock per row.
  std::vector<PopularRow> top = sketch_.TopK(UINT32_MAX);
  std::vector<Queue> plan;
  absl::flat_hash_map<uint32_t, size_t> queue_of;
  for (const PopularRow& p : top) {
    if (cache_.Peek(p.table_id, p.row).has_value()) continue;
    auto [it, fresh] = queue_of.emplace(p.table_id, plan.size());
    if (fresh) plan.push_back(Queue{p.table_id, {}});
    plan[it->second].rows.push_back(p);
  }
  absl::MutexLock lock(&mu_);
  if (gen != kick_gen_ || stats_.cancelled) return;  // kicked again or cancelled meanwhile
  plan_pending_ = false;
  plan_ = std::move(plan);
  if (!stats_.in_flight) ScheduleTickLocked(absl::ZeroDuration());
}

void Refiller::Cancel() {
  absl::MutexLock lock(&mu_);
  stats_.cancelled = true;
  plan_pending_ = false;
  plan_.clear();
  if (timer_set_) {
    clock_.Cancel(timer_);
    timer_set_ = false;
  }
}

void Refiller::ScheduleTickLocked(absl::Duration delay) {
  if (timer_set_) return;
  timer_set_ = true;
  const uint64_t gen = ++tick_gen_;
  timer_ = clock_.ScheduleAfter(delay, [life = life_, gen] {
    absl::MutexLock life_lock(&life->mu);
    if (life->owner != nullptr) life->owner->Tick(gen);
  });
}

void Refiller::RefillTokensLocked() {
  const absl::Time now = clock_.Now();
  tokens_ = std::min(static_cast<double>(options_.burst_bytes),
                     tokens_ + absl::ToDoubleSeconds(now - tokens_at_) * options_.bytes_per_second);
  tokens_at_ = now;
}

std::vector<uint64_t> Refiller::NextRowsLocked(uint32_t* table_id, uint32_t* row_bytes) {
  std::vector<uint64_t> rows;
  while (rows.empty() && !plan_.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < plan_.size(); ++i) {
      if (plan_[i].rows.front().count > plan_[best].rows.front().count) best = i;
    }
    Queue& q = plan_[best];
    const std::optional<uint32_t> rb = cache_.RowBytes(q.table_id);
    // Only free slots: refill never evicts what the miss path admitted.
    const uint64_t free = rb.has_value() ? cache_.FreeSlots(q.table_id) : 0;
    if (free > 0) {
      const uint64_t max_rows =
          std::min<uint64_t>(free, std::max<uint64_t>(1, options_.chunk_bytes / *rb));
      while (!q.rows.empty() && rows.size() < max_rows) {
        const uint64_t row = q.rows.front().row;
        q.rows.pop_front();
        if (!cache_.Peek(q.table_id, row).has_value()) rows.push_back(row);
      }
      *table_id = q.table_id;
      *row_bytes = *rb;
    }
    if (free == 0 || q.rows.empty()) plan_.erase(plan_.begin() + best);
  }
  return rows;
}

uint64_t Refiller::BacklogLocked() const {
  uint64_t n = 0;
  for (const Queue& q : plan_) n += q.rows.size();
  return n;
}

void Refiller::Tick(uint64_t gen) {
  auto chunk = std::make_shared<Chunk>();
  {
    absl::MutexLock lock(&mu_);
    if (gen != tick_gen_) return;  // a timer Cancel() could not stop in time
    timer_set_ = false;
    if (stats_.in_flight || stats_.cancelled || plan_.empty()) return;
    if (device_.critical_pending()) {
      ++stats_.deferred_critical;
      ScheduleTickLocked(options_.poll_interval);
      return;
    }
    RefillTokensLocked();
    if (tokens_ < static_cast<double>(options_.chunk_bytes)) {
      ++stats_.deferred_rate;
      ScheduleTickLocked(options_.poll_interval);
      return;
    }
    chunk->rows = NextRowsLocked(&chunk->table_id, &chunk->row_bytes);
    if (chunk->rows.empty()) return;  // the plan is done
    tokens_ -= static_cast<double>(chunk->rows.size() * chunk->row_bytes);
    stats_.in_flight = true;
  }
  chunk->cache = &cache_;
  chunk->clock = &clock_;
  chunk->life = life_;
  chunk->staging.resize(chunk->rows.size() * chunk->row_bytes);
  absl::Status fetched = source_.Fetch(chunk->table_id, chunk->rows, chunk->staging,
                                       clock_.Now() + options_.fetch_timeout);
  if (!fetched.ok()) {
    ChunkDone(0, 0, 0, /*failed=*/true);
    return;
  }
  if (!IssueCopies(chunk)) ChunkDone(0, 0, 0, /*failed=*/false);
}

bool Refiller::IssueCopies(const std::shared_ptr<Chunk>& chunk) {
  EmbReservation res;
  // RESOURCE_EXHAUSTED part-way still leaves the rows before it reserved; copy those.
  (void)cache_.ReserveBatch(chunk->table_id, chunk->rows, &res);
  for (uint32_t i : res.reserved_positions) {
    chunk->reserved.push_back(chunk->rows[i]);
    chunk->reserved_at.push_back(i);
    chunk->offsets.push_back(res.offsets[i]);
  }
  const size_t n = chunk->reserved.size();
  if (n == 0) return false;
  // Runs of rows adjacent both in staging and in the pool go as one copy.
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end) over reserved rows
  const uint64_t rb = chunk->row_bytes;
  for (size_t i = 0; i < n; ++i) {
    if (!runs.empty()) {
      auto& [b, e] = runs.back();
      if (chunk->reserved_at[i] == chunk->reserved_at[i - 1] + 1 &&
          chunk->offsets[i] == chunk->offsets[i - 1] + rb &&
          (e - b + 1) * rb <= options_.max_copy_bytes) {
        e = i + 1;
        continue;
      }
    }
    runs.emplace_back(i, i + 1);
  }
  {
    absl::MutexLock lock(&chunk->mu);
    chunk->outstanding = static_cast<uint32_t>(runs.size());
    chunk->failed.assign(n, false);
  }
  for (const auto& [b, e] : runs) {
    device_.CopyToPool(CopyClass::kBackground, CopyPurpose::kEmbRefill,
                       chunk->staging.data() + chunk->reserved_at[b] * rb, chunk->offsets[b],
                       (e - b) * rb, [chunk, b = b, e = e](absl::Status st) {
                         bool last;
                         {
                           absl::MutexLock lock(&chunk->mu);
                           if (!st.ok()) {
                             for (size_t i = b; i < e; ++i) chunk->failed[i] = true;
                           }
                           last = --chunk->outstanding == 0;
                         }
                         if (last) FinishChunk(chunk);
                       });
  }
  return true;
}

void Refiller::FinishChunk(const std::shared_ptr<Chunk>& chunk) {
  std::vector<uint64_t> ok, bad;
  {
    absl::MutexLock lock(&chunk->mu);
    for (size_t i = 0; i < chunk->reserved.size(); ++i) {
      (chunk->failed[i] ? bad : ok).push_back(chunk->reserved[i]);
    }
  }
  // Commit right here, as the bytes have landed; the bookkeeping waits for a timer so it never
  // runs inside a device call.
  if (!ok.empty()) (void)chunk->cache->Commit(chunk->table_id, ok);
  if (!bad.empty()) (void)chunk->cache->Abort(chunk->table_id, bad);
  const uint64_t rows = ok.size(), bytes = ok.size() * chunk->row_bytes, aborted = bad.size();
  chunk->clock->ScheduleAfter(absl::ZeroDuration(), [life = chunk->life, rows, bytes, aborted] {
    absl::MutexLock life_lock(&life->mu);
    if (life->owner != nullptr) life->owner->ChunkDone(rows, bytes, aborted, aborted > 0);
  });
}

void Refiller::ChunkDone(uint64_t rows, uint64_t bytes, uint64_t aborted, bool failed) {
  absl::MutexLock lock(&mu_);
  stats_.in_flight = false;
  stats_.rows_refilled += rows;
  stats_.bytes_refilled += bytes;
  stats_.rows_aborted += aborted;
  if (failed) {
    ++stats_.chunks_failed;
  } else if (rows > 0) {
    ++stats_.chunks;
  }
  if (rows > 0 && failed) ++stats_.chunks;
  if (stats_.cancelled || plan_.empty()) return;
  // After a failure, back off one poll interval rather than hammer a failing source.
  ScheduleTickLocked(failed ? options_.poll_interval : absl::ZeroDuration());
}

RefillStats Refiller::GetStats() const {
  absl::MutexLock lock(&mu_);
  RefillStats s = stats_;
  s.backlog_rows = BacklogLocked();
  s.done = !s.in_flight && plan_.empty() && !plan_pending_;
  return s;
}

}  // namespace hlem::serving
