// EmbCache's accounting read-outs and its invariant check (for tests).

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/emb_cache_internal.h"

namespace hlem::serving {

uint64_t EmbCache::ResidentRows(uint32_t table_id, uint64_t shard) {
  absl::MutexLock lock(&mu_);
  DrainPendingLocked(kDrainPerQuery);
  const Key key{table_id, shard};
  auto it = resident_.find(key);
  uint64_t rows = it == resident_.end() ? 0 : it->second;
  // Counts of shrunk pages not yet subtracted: one probe per such page.
  for (const ShardCounts& counts : pending_) {
    if (auto p = counts.find(key); p != counts.end()) rows -= p->second;
  }
  return rows;
}

bool EmbCache::DrainPending(size_t max_items) {
  absl::MutexLock lock(&mu_);
  DrainPendingLocked(max_items);
  return !pending_.empty();
}

EmbCacheStats EmbCache::GetStats() const {
  absl::MutexLock lock(&mu_);
  EmbCacheStats s = stats_;
  s.as_of = clock_.Now();
  s.pages_held = held_.size();
  s.bytes_held = held_.size() * pool_.page_bytes();
  s.entries = live_entries_;
  s.stale_entries = stale_entries_;
  s.pending_entries = reserved_.size();
  s.pinned_entries = pinned_entries_;
  s.budget_pages = budget_pages_;
  return s;
}

absl::Status EmbCache::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  uint64_t kept_pages = 0;  // pages a reservation or a reader keeps past a budget cut
  for (PageId p : held_) kept_pages += pages_[p].pending > 0 || pages_[p].pinned > 0;
  if (held_.size() > budget_pages_ + kept_pages) {
    return fail("holds ", held_.size(), " pages over budget ", budget_pages_, " (", kept_pages,
                " with copies in flight or readers)");
  }
  uint64_t class_pages = 0;
  for (const SizeClass& c : classes_) class_pages += c.pages;
  if (class_pages != held_.size()) return fail("classes hold ", class_pages, " != ", held_.size());
  for (size_t i = 0; i < held_.size(); ++i) {
    const PageMeta& pm = pages_[held_[i]];
    if (pm.cls < 0 || pm.held_pos != i) return fail("held page ", held_[i], " bad meta");
    if (pool_.owner(held_[i]) != PageOwner::kEmb) return fail("held page ", held_[i], " not EMB");
    const SizeClass& c = classes_[pm.cls];
    bool open = pm.used < c.slots_per_page || !pm.holes.empty();
    if (open != (pm.open_pos != kNotOpen) || (open && c.open[pm.open_pos] != held_[i])) {
      return fail("page ", held_[i], " open list mismatch");
    }
  }
  uint64_t held_pages_seen = 0;
  for (const PageMeta& pm : pages_) held_pages_seen += pm.cls >= 0;
  if (held_pages_seen != held_.size()) return fail("pages marked held != held list");

  uint64_t live = 0, stale = 0, in_use = 0;
  for (const EmbEntry& x : store_->entries) in_use += x.in_use;
  if (in_use != index_.size()) return fail(in_use, " entries in use, index has ", index_.size());
  std::vector<uint32_t> page_live(pages_.size(), 0), page_pending(pages_.size(), 0),
      page_pinned(pages_.size(), 0);
  uint64_t pending = 0, pinned = 0;
  ShardCounts shard_count;
  std::vector<ShardCounts> page_shards(pages_.size());
  absl::flat_hash_set<uint64_t> slots;
  for (const auto& [key, e] : index_) {
    const EmbEntry& x = store_->entries[e];
    const bool is_pending = reserved_.contains(e);
    if (!x.in_use || x.table_id != key.table_id || x.row != key.id || x.detached != is_pending) {
      return fail("index entry (", key.table_id, ",", key.id, ") -> bad entry ", e);
    }
    if (x.pins > 0 && (is_pending || store_->IsStale(e))) {
      return fail("pinned entry ", e, " is pending or stale");
    }
    if (store_->IsStale(e)) {
      if (is_pending) return fail("pending entry ", e, " is stale");
      ++stale;
      continue;
    }
    ++live;
    const PageMeta& pm = pages_[x.page];
    if (pm.cls != x.cls || x.slot >= pm.used) return fail("entry ", e, " on a bad slot");
    if (classes_[x.cls].row_bytes != classes_[table_class_.at(x.table_id)].row_bytes) {
      return fail("entry ", e, " in the wrong size class");
    }
    if (!slots.insert((uint64_t{x.page} << 32) | x.slot).second) {
      return fail("two live entries on page ", x.page, " slot ", x.slot);
    }
    ++page_live[x.page];
    if (x.pins > 0) {
      ++page_pinned[x.page];
      ++pinned;
    }
    if (is_pending) {
      ++page_pending[x.page];
      ++pending;
      continue;
    }
    ++shard_count[ShardKey(x.table_id, x.row)];
    ++page_shards[x.page][ShardKey(x.table_id, x.row)];
  }
  if (pending != reserved_.size()) return fail(reserved_.size() - pending, " pending not indexed");
  if (live != live_entries_ || stale != stale_entries_) {
    return fail("live/stale ", live, "/", stale, " counted, ", live_entries_, "/", stale_entries_,
                " kept");
  }
  for (size_t p = 0; p < pages_.size(); ++p) {
    const PageMeta& pm = pages_[p];
    if (pm.live != page_live[p] || pm.used != page_live[p] + pm.holes.size() ||
        pm.pending != page_pending[p] || pm.pinned != page_pinned[p]) {
      return fail("page ", p, " live ", pm.live, " used ", pm.used, " holes ", pm.holes.size(),
                  " pending ", pm.pending, " pinned ", pm.pinned, " counted ", page_live[p],
                  " live ", page_pending[p], " pending ", page_pinned[p], " pinned");
    }
    for (uint32_t hole : pm.holes) {
      if (hole >= pm.used || slots.contains((uint64_t{p} << 32) | hole)) {
        return fail("page ", p, " hole ", hole, " is not a free slot");
      }
    }
    if (pages_[p].shards != page_shards[p]) return fail("page ", p, " shard counts differ");
  }
  ShardCounts kept = resident_;
  for (const ShardCounts& counts : pending_) {
    for (const auto& [k, n] : counts) kept[k] -= n;
  }
  for (auto it = kept.begin(); it != kept.end();) {
    auto cur = it++;
    if (cur->second == 0) kept.erase(cur);
  }
  if (kept != shard_count) return fail("resident-row counters differ from a recount");
  uint64_t listed = 0;
  for (const SizeClass& c : classes_) {
    if (absl::Status st = c.policy->Check(&listed); !st.ok()) return st;
  }
  if (pinned != pinned_entries_) return fail(pinned, " pinned entries counted, ", pinned_entries_);
  if (listed + pending != in_use) {
    return fail(listed, " entries in policy lists, ", pending, " pending, ", in_use, " in use");
  }
  return absl::OkStatus();
}

}  // namespace hlem::serving
