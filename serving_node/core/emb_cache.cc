#include "serving_node/core/emb_cache.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/rng.h"
#include "serving_node/core/emb_cache_internal.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<EmbCache>> EmbCache::Create(const EmbCacheOptions& options,
                                                           HbmPool& pool, Clock& clock) {
  if (options.tables.empty()) return absl::InvalidArgumentError("emb_cache.tables: empty");
  absl::flat_hash_set<uint32_t> ids;
  for (const EmbTableSpec& t : options.tables) {
    if (!ids.insert(t.table_id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("emb_cache.tables: table_id ", t.table_id, " appears twice"));
    }
    if (t.row_bytes == 0 || t.row_bytes > pool.page_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("emb_cache.tables[", t.table_id, "].row_bytes: ", t.row_bytes,
                       " must be in 1 .. page_bytes (", pool.page_bytes(), ")"));
    }
  }
  if (!(options.promotion_window >= 0 && options.promotion_window <= 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "emb_cache.promotion_window: ", options.promotion_window, " must be in [0, 0.5]"));
  }
  if (options.residency_shard_rows == 0) {
    return absl::InvalidArgumentError("emb_cache.residency_shard_rows: must be positive");
  }
  return std::unique_ptr<EmbCache>(new EmbCache(options, pool, clock));
}

EmbCache::EmbCache(const EmbCacheOptions& options, HbmPool& pool, Clock& clock)
    : pool_(pool),
      clock_(clock),
      policy_kind_(options.policy),
      residency_shard_rows_(options.residency_shard_rows),
      pages_(pool.num_pages()),
      store_(std::make_unique<EmbEntryStore>()),
      budget_pages_(options.budget_pages) {
  store_->page_gen.assign(pool.num_pages(), 0);
  for (const EmbTableSpec& t : options.tables) {
    uint32_t cls = 0;
    while (cls < classes_.size() && classes_[cls].row_bytes != t.row_bytes) ++cls;
    if (cls == classes_.size()) {
      SizeClass c;
      c.row_bytes = t.row_bytes;
      c.slots_per_page = static_cast<uint32_t>(pool.page_bytes() / t.row_bytes);
      c.policy = MakeEmbReplacementPolicy(options.policy, *store_, pool.num_pages(),
                                          uint64_t{pool.num_pages()} * c.slots_per_page,
                                          options.sketch_width, options.promotion_window);
      classes_.push_back(std::move(c));
    }
    table_class_[t.table_id] = cls;
  }
}

EmbCache::~EmbCache() {
  absl::MutexLock lock(&mu_);
  for (PageId p : held_) pool_.FreePage(p);
}

absl::Status EmbCache::Lookup(uint32_t table_id, std::span<const uint64_t> rows,
                              EmbLookupResult* out, bool pin) {
  absl::MutexLock lock(&mu_);
  auto cit = table_class_.find(table_id);
  if (cit == table_class_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("EmbCache::Lookup: unknown table ", table_id));
  }
  SizeClass& c = classes_[cit->second];
  const size_t n = rows.size();
  out->offsets.resize(n);
  out->miss_positions.clear();
  out->pending_positions.clear();
  out->pinned.clear();
  out->hits = 0;
  if (policy_kind_ == EmbPolicy::kTinyLfu) {
    scratch_hashes_.resize(n);
    for (size_t i = 0; i < n; ++i) scratch_hashes_[i] = EmbKeyHash(table_id, rows[i]);
    c.policy->RecordAccesses(scratch_hashes_);
  }
  // Pass 1 probes the index with the probe of row i + kProbeAhead in flight, and prefetches the
  // entry each probe finds, so that the random reads of a batch overlap instead of stalling one
  // after the other (a batch of cold rows is a chain of cache misses otherwise).
  constexpr size_t kProbeAhead = 12;
  scratch_found_.resize(n);
  for (size_t i = 0; i < std::min(n, kProbeAhead); ++i) index_.prefetch(Key{table_id, rows[i]});
  for (size_t i = 0; i < n; ++i) {
    if (i + kProbeAhead < n) index_.prefetch(Key{table_id, rows[i + kProbeAhead]});
    auto it = index_.find(Key{table_id, rows[i]});
    EntryId e = it == index_.end() ? kNil : it->second;
    scratch_found_[i] = e;
    if (e != kNil) {
      const char* x = reinterpret_cast<const char*>(&store_->entries[e]);
      __builtin_prefetch(x);
      __builtin_prefetch(x + kEmbEntryHotBytes - 1);
    }
  }
  // Pass 2 serves the hits. An entry pass 1 found may have been dropped since as stale, when the
  // batch repeats its row (no call below allocates an entry, so a dropped id stays unused).
  for (size_t i = 0; i < n; ++i) {
    EntryId e = scratch_found_[i];
    if (e != kNil && store_->entries[e].in_use) {
      if (!store_->IsStale(e)) {
        const EmbEntry& x = store_->entries[e];
        if (x.detached) {  // pending: its bytes are still in flight
          out->offsets[i] = kEmbMiss;
          out->pending_positions.push_back(static_cast<uint32_t>(i));
          continue;
        }
        out->offsets[i] = SlotOffset(x.page, x.slot, c.row_bytes);
        c.policy->Touch(e);
        FlushStaleFoundLocked();
        if (pin) {
          if (store_->entries[e].pins++ == 0) {
            ++pages_[x.page].pinned;
            ++pinned_entries_;
          }
          out->pinned.push_back(e);
        }
        TouchPageLocked(x.page);
        ++out->hits;
        continue;
      }
      DropStaleLocked(e);
    }
    out->offsets[i] = kEmbMiss;
    out->miss_positions.push_back(static_cast<uint32_t>(i));
  }
  stats_.lookups += rows.size();
  stats_.hits += out->hits;
  stats_.misses += rows.size() - out->hits;
  stats_.pending_lookups += out->pending_positions.size();
  UpkeepLocked();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> EmbCache::Insert(uint32_t table_id, uint64_t row) {
  absl::MutexLock lock(&mu_);
  auto cit = table_class_.find(table_id);
  if (cit == table_class_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("EmbCache::Insert: unknown table ", table_id));
  }
  absl::StatusOr<uint64_t> offset = InsertLocked(cit->second, table_id, row, Admit::kVisible);
  UpkeepLocked();
  return offset;
}

absl::Status EmbCache::InsertBatch(uint32_t table_id, std::span<const uint64_t> rows,
                                   std::vector<uint64_t>* offsets) {
  absl::MutexLock lock(&mu_);
  offsets->clear();
  auto cit = table_class_.find(table_id);
  if (cit == table_class_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("EmbCache::InsertBatch: unknown table ", table_id));
  }
  // Rows of this batch leave the policy lists until the batch is done, so none is a victim.
  scratch_.clear();
  absl::Status status;
  for (uint64_t row : rows) {
    absl::StatusOr<uint64_t> offset = InsertLocked(cit->second, table_id, row, Admit::kBatch);
    if (!offset.ok()) {
      status = offset.status();
      break;
    }
    offsets->push_back(*offset);
  }
  AttachBatchLocked(cit->second);
  UpkeepLocked();
  return status;
}

void EmbCache::AttachBatchLocked(uint32_t cls) {
  EmbReplacementPolicy& policy = *classes_[cls].policy;
  for (EntryId e : scratch_) {
    store_->entries[e].detached = false;
    policy.Attach(e);
  }
  scratch_.clear();
}

absl::StatusOr<uint64_t> EmbCache::InsertLocked(uint32_t cls, uint32_t table_id, uint64_t row,
                                                Admit mode, bool* was_pending) {
  SizeClass& c = classes_[cls];
  const Key key{table_id, row};
  const bool detach = mode != Admit::kVisible;
  if (was_pending != nullptr) *was_pending = false;
  if (auto it = index_.find(key); it != index_.end()) {
    EntryId e = it->second;
    if (!store_->IsStale(e)) {
      EmbEntry& x = store_->entries[e];
      if (x.detached && was_pending != nullptr) *was_pending = reserved_.contains(e);
      if (!x.detached) {
        c.policy->Touch(e);
        FlushStaleFoundLocked();
        if (detach) {
          c.policy->Detach(e);
          x.detached = true;
          scratch_.push_back(e);
        }
      }
      TouchPageLocked(x.page);
      return SlotOffset(x.page, x.slot, c.row_bytes);
    }
    DropStaleLocked(e);
  }
  PageId page = kNoPage;
  uint32_t slot = 0;
  if (absl::Status st = TakeSlotLocked(cls, &page, &slot); !st.ok()) {
    ++stats_.insert_exhausted;
    return st;
  }
  EntryId e = store_->Alloc();
  EmbEntry& x = store_->entries[e];
  x.row = row;
  x.table_id = table_id;
  x.page = page;
  x.slot = slot;
  x.gen = store_->page_gen[page];
  x.cls = static_cast<uint16_t>(cls);
  index_[key] = e;
  if (mode == Admit::kPending) {
    x.detached = true;  // enters the policy at Commit
  } else {
    c.policy->Insert(e);
    FlushStaleFoundLocked();
    if (detach) {
      c.policy->Detach(e);
      x.detached = true;
    }
  }
  PageMeta& pm = pages_[page];
  ++pm.live;
  ++live_entries_;
  if (mode == Admit::kPending) {
    reserved_.insert(e);
    ++pm.pending;
    ++stats_.reserved;
  } else {
    if (detach) scratch_.push_back(e);
    const Key shard = ShardKey(table_id, row);
    ++pm.shards[shard];
    ++resident_[shard];
    ++stats_.inserts;
  }
  TouchPageLocked(page);
  return SlotOffset(page, slot, c.row_bytes);
}

absl::Status EmbCache::TakeSlotLocked(uint32_t cls, PageId* page, uint32_t* slot) {
  SizeClass& c = classes_[cls];
  if (c.open.empty() && held_.size() < budget_pages_) {
    absl::StatusOr<PageId> p = pool_.AllocPage(PageOwner::kEmb);
    if (p.ok()) {
      PageMeta& pm = pages_[*p];
      pm = PageMeta();
      pm.cls = static_cast<int32_t>(cls);
      pm.held_pos = static_cast<uint32_t>(held_.size());
      held_.push_back(*p);
      pm.open_pos = static_cast<uint32_t>(c.open.size());
      c.open.push_back(*p);
      pm.heat_epoch = heat_epoch_;
      pm.last_access = ticks_;
      ++c.pages;
      c.policy->SetCapacity(uint64_t{c.pages} * c.slots_per_page);
    }
  }
  if (!c.open.empty()) {
    *page = c.open.back();
    PageMeta& pm = pages_[*page];
    if (!pm.holes.empty()) {
      *slot = pm.holes.back();
      pm.holes.pop_back();
    } else {
      *slot = pm.used++;
    }
    if (pm.used == c.slots_per_page && pm.holes.empty()) {
      c.open.pop_back();
      pm.open_pos = kNotOpen;
    }
    return absl::OkStatus();
  }
  EntryId victim = c.policy->Victim();
  FlushStaleFoundLocked();
  // A pinned entry is being read: it goes to the recent end of its list, as a hit would, and the
  // policy names another. Once every pinned entry has been passed over, none is left to pass.
  for (uint64_t passed = 0; victim != kNil && store_->entries[victim].pins > 0; ++passed) {
    if (passed >= pinned_entries_) {
      victim = kNil;
      break;
    }
    c.policy->Detach(victim);
    c.policy->Attach(victim);
    victim = c.policy->Victim();
    FlushStaleFoundLocked();
  }
  if (victim == kNil) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "EmbCache: no slot for rows of ", c.row_bytes, " bytes (budget ", budget_pages_, " pages, ",
        held_.size(), " held, ", c.pages, " of this size)"));
  }
  *page = store_->entries[victim].page;
  *slot = store_->entries[victim].slot;
  EvictLocked(victim);
  return absl::OkStatus();
}

void EmbCache::EvictLocked(EntryId e) {
  EmbEntry& x = store_->entries[e];
  classes_[x.cls].policy->Remove(e);
  index_.erase(Key{x.table_id, x.row});
  PageMeta& pm = pages_[x.page];
  --pm.live;
  const Key shard = ShardKey(x.table_id, x.row);
  if (auto it = pm.shards.find(shard); --it->second == 0) pm.shards.erase(it);
  if (auto it = resident_.find(shard); --it->second == 0) resident_.erase(it);
  --live_entries_;
  ++stats_.evictions;
  store_->Release(e);
}

void EmbCache::DropStaleLocked(EntryId e) {
  classes_[store_->entries[e].cls].policy->RemoveStale(e);
  ForgetStaleLocked(e);
}

void EmbCache::ForgetStaleLocked(EntryId e) {
  const EmbEntry& x = store_->entries[e];
  index_.erase(Key{x.table_id, x.row});
  --stale_entries_;
  ++stats_.stale_dropped;
  store_->Release(e);
}

void EmbCache::FlushStaleFoundLocked() {
  if (store_->stale_found.empty()) return;
  scratch_stale_.swap(store_->stale_found);
  for (EntryId e : scratch_stale_) ForgetStaleLocked(e);
  scratch_stale_.clear();
}

void EmbCache::TouchPageLocked(PageId page) {
  ++ticks_;
  if (++epoch_ticks_ > std::max<uint64_t>(1024, live_entries_)) {
    ++heat_epoch_;
    epoch_ticks_ = 0;
  }
  PageMeta& pm = pages_[page];
  uint32_t heat = PageHeatLocked(pm);
  pm.heat = heat == UINT32_MAX ? heat : heat + 1;
  pm.heat_epoch = heat_epoch_;
  pm.last_access = ticks_;
}

uint32_t EmbCache::PageHeatLocked(const PageMeta& pm) const {
  uint32_t age = heat_epoch_ - pm.heat_epoch;
  return age >= 32 ? 0 : pm.heat >> age;
}

void EmbCache::DropPageLocked(PageId page) {
  PageMeta& pm = pages_[page];
  if (pm.pending != 0 || pm.pinned != 0) {
    GetLogger("emb_cache")
        ->critical("check_failed page={} pending={} pinned={} dropped", page, pm.pending,
                   pm.pinned);
    std::abort();
  }
  SizeClass& c = classes_[pm.cls];
  ++store_->page_gen[page];  // every entry on the page is stale from here on
  c.policy->DropPage(page);
  stale_entries_ += pm.live;
  live_entries_ -= pm.live;
  stats_.shrunk_entries += pm.live;
  ++stats_.shrunk_pages;
  if (!pm.shards.empty()) pending_.push_back(std::move(pm.shards));
  if (pm.open_pos != kNotOpen) {
    PageId last = c.open.back();
    c.open[pm.open_pos] = last;
    pages_[last].open_pos = pm.open_pos;
    c.open.pop_back();
  }
  PageId last = held_.back();
  held_[pm.held_pos] = last;
  pages_[last].held_pos = pm.held_pos;
  held_.pop_back();
  --c.pages;
  c.policy->SetCapacity(uint64_t{c.pages} * c.slots_per_page);
  pm = PageMeta();
  pool_.FreePage(page);
}

uint32_t EmbCache::GiveBackLocked(uint32_t n_pages, std::vector<PageId>* freed) {
  if (n_pages == 0) return 0;
  std::vector<std::tuple<uint32_t, uint64_t, PageId>> order;
  order.reserve(held_.size());
  for (PageId p : held_) {
    // A page with a copy in flight stays until the copy commits or aborts; one a reader pinned,
    // until it is unpinned.
    if (pages_[p].pending == 0 && pages_[p].pinned == 0)
      order.emplace_back(PageHeatLocked(pages_[p]), pages_[p].last_access, p);
  }
  const uint32_t n = std::min<uint32_t>(n_pages, static_cast<uint32_t>(order.size()));
  if (n < order.size()) std::nth_element(order.begin(), order.begin() + n, order.end());
  for (uint32_t i = 0; i < n; ++i) {
    PageId p = std::get<2>(order[i]);
    DropPageLocked(p);
    if (freed != nullptr) freed->push_back(p);
  }
  return n;
}

uint32_t EmbCache::ShrinkLocked(uint32_t n_pages, std::vector<PageId>* freed) {
  const uint32_t n = GiveBackLocked(n_pages, freed);
  budget_pages_ -= std::min(budget_pages_, n);
  return n;
}

uint32_t EmbCache::Shrink(uint32_t n_pages, std::vector<PageId>* freed) {
  absl::MutexLock lock(&mu_);
  return ShrinkLocked(n_pages, freed);
}

void EmbCache::SetBudgetPages(uint32_t pages, std::vector<PageId>* freed) {
  absl::MutexLock lock(&mu_);
  if (held_.size() > pages) GiveBackLocked(static_cast<uint32_t>(held_.size()) - pages, freed);
  budget_pages_ = pages;
}

uint32_t EmbCache::budget_pages() const {
  absl::MutexLock lock(&mu_);
  return budget_pages_;
}

void EmbCache::UpkeepLocked() {
  // A few steps per call keep stale entries and pending counts bounded by the work that made them.
  if (stale_entries_ > 0 && !store_->entries.empty()) {
    for (int i = 0; i < 4; ++i) {
      if (sweep_pos_ >= store_->entries.size()) sweep_pos_ = 0;
      EntryId e = sweep_pos_++;
      if (store_->entries[e].in_use && store_->IsStale(e)) DropStaleLocked(e);
    }
  }
  DrainPendingLocked(2);
}

void EmbCache::DrainPendingLocked(size_t max_items) {
  while (max_items > 0 && !pending_.empty()) {
    ShardCounts& counts = pending_.back();
    while (max_items > 0 && !counts.empty()) {
      auto it = counts.begin();
      auto rit = resident_.find(it->first);
      rit->second -= it->second;
      if (rit->second == 0) resident_.erase(rit);
      counts.erase(it);
      --max_items;
    }
    if (counts.empty()) pending_.pop_back();
  }
}

}  // namespace hlem::serving
