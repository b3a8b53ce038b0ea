// EmbCache's two-phase admission: ReserveBatch / Commit / Abort, and Peek.

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/emb_cache_internal.h"

namespace hlem::serving {

absl::Status EmbCache::ReserveBatch(uint32_t table_id, std::span<const uint64_t> rows,
                                    EmbReservation* out) {
  absl::MutexLock lock(&mu_);
  out->offsets.clear();
  out->reserved_positions.clear();
  auto cit = table_class_.find(table_id);
  if (cit == table_class_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmbCache::ReserveBatch: unknown table ", table_id));
  }
  scratch_.clear();
  absl::Status status;
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint64_t entries_before = stats_.reserved;
    bool was_pending = false;
    absl::StatusOr<uint64_t> offset =
        InsertLocked(cit->second, table_id, rows[i], Admit::kPending, &was_pending);
    if (!offset.ok()) {
      status = offset.status();
      break;
    }
    out->offsets.push_back(was_pending ? kEmbMiss : *offset);
    if (stats_.reserved != entries_before) {
      out->reserved_positions.push_back(static_cast<uint32_t>(i));
    }
  }
  AttachBatchLocked(cit->second);
  UpkeepLocked();
  return status;
}

uint32_t EmbCache::PendingEntryLocked(uint32_t table_id, uint64_t row) const {
  auto it = index_.find(Key{table_id, row});
  if (it == index_.end() || !reserved_.contains(it->second)) return kNil;
  return it->second;
}

absl::Status EmbCache::ResolvePending(const char* op, uint32_t table_id,
                                      std::span<const uint64_t> rows,
                                      const std::function<void(uint32_t cls, uint32_t e)>& fn) {
  absl::MutexLock lock(&mu_);
  auto cit = table_class_.find(table_id);
  if (cit == table_class_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("EmbCache::", op, ": unknown table ", table_id));
  }
  uint64_t not_pending = 0;
  for (uint64_t row : rows) {
    const EntryId e = PendingEntryLocked(table_id, row);
    if (e == kNil) {
      ++not_pending;
      continue;
    }
    reserved_.erase(e);
    fn(cit->second, e);
  }
  GiveBackExcessLocked();
  UpkeepLocked();
  if (not_pending > 0) {
    return absl::FailedPreconditionError(absl::StrCat("EmbCache::", op, ": ", not_pending, " of ",
                                                      rows.size(), " rows were not pending"));
  }
  return absl::OkStatus();
}

absl::Status EmbCache::Commit(uint32_t table_id, std::span<const uint64_t> rows) {
  return ResolvePending(
      "Commit", table_id, rows, [&](uint32_t cls, EntryId e) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        EmbEntry& x = store_->entries[e];
        x.detached = false;
        classes_[cls].policy->Insert(e);  // a pending entry is not in the policy until now
        FlushStaleFoundLocked();
        PageMeta& pm = pages_[x.page];
        --pm.pending;
        const Key shard = ShardKey(x.table_id, x.row);
        ++pm.shards[shard];
        ++resident_[shard];
        ++stats_.inserts;
        ++stats_.committed;
      });
}

absl::Status EmbCache::Abort(uint32_t table_id, std::span<const uint64_t> rows) {
  return ResolvePending("Abort", table_id, rows,
                        [&](uint32_t cls, EntryId e) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                          SizeClass& c = classes_[cls];
                          const EmbEntry& x = store_->entries[e];
                          const PageId page = x.page;
                          PageMeta& pm = pages_[page];
                          --pm.pending;
                          --pm.live;
                          --live_entries_;
                          pm.holes.push_back(x.slot);
                          if (pm.open_pos == kNotOpen) {
                            pm.open_pos = static_cast<uint32_t>(c.open.size());
                            c.open.push_back(page);
                          }
                          index_.erase(Key{x.table_id, x.row});
                          store_->Release(e);
                          ++stats_.aborted;
                        });
}

absl::Status EmbCache::Unpin(std::span<const uint32_t> pinned) {
  absl::MutexLock lock(&mu_);
  uint64_t not_pinned = 0;
  for (const EntryId e : pinned) {
    if (e >= store_->entries.size() || !store_->entries[e].in_use || store_->entries[e].pins == 0) {
      ++not_pinned;
      continue;
    }
    EmbEntry& x = store_->entries[e];
    if (--x.pins > 0) continue;
    --pages_[x.page].pinned;
    --pinned_entries_;
  }
  GiveBackExcessLocked();
  UpkeepLocked();
  if (not_pinned > 0) {
    return absl::FailedPreconditionError(absl::StrCat("EmbCache::Unpin: ", not_pinned, " of ",
                                                      pinned.size(), " handles held no pin"));
  }
  return absl::OkStatus();
}

void EmbCache::GiveBackExcessLocked() {
  if (held_.size() > budget_pages_) {
    GiveBackLocked(static_cast<uint32_t>(held_.size()) - budget_pages_, nullptr);
  }
}

std::optional<uint32_t> EmbCache::RowBytes(uint32_t table_id) const {
  absl::MutexLock lock(&mu_);
  auto cit = table_class_.find(table_id);
  if (cit == table_class_.end()) return std::nullopt;
  return classes_[cit->second].row_bytes;
}

uint64_t EmbCache::FreeSlots(uint32_t table_id) const {
  absl::MutexLock lock(&mu_);
  auto cit = table_class_.find(table_id);
  if (cit == table_class_.end()) return 0;
  const SizeClass& c = classes_[cit->second];
  uint64_t slots = 0;
  for (PageId p : c.open) slots += c.slots_per_page - pages_[p].used + pages_[p].holes.size();
  if (budget_pages_ > held_.size()) {
    slots += uint64_t{std::min<uint32_t>(budget_pages_ - static_cast<uint32_t>(held_.size()),
                                         pool_.free_pages())} *
             c.slots_per_page;
  }
  return slots;
}

std::optional<uint64_t> EmbCache::Peek(uint32_t table_id, uint64_t row, bool* pending) const {
  absl::MutexLock lock(&mu_);
  auto cit = table_class_.find(table_id);
  if (cit == table_class_.end()) return std::nullopt;
  auto it = index_.find(Key{table_id, row});
  if (it == index_.end() || store_->IsStale(it->second)) return std::nullopt;
  const EmbEntry& x = store_->entries[it->second];
  if (pending != nullptr) *pending = x.detached;  // between calls: detached == pending
  return SlotOffset(x.page, x.slot, classes_[cit->second].row_bytes);
}

}  // namespace hlem::serving
