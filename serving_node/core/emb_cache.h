#pragma once
// The serving node's embedding cache (ARCHITECTURE §4, §7): fixed-size row slots laid over EMB
// pages of the HbmPool, an index (table_id, row) -> slot, and a replacement policy.
//
// Layout. Every table has a row size in bytes; tables of the same row size share a size class.
// An EMB page belongs to one size class at a time and holds page_bytes / row_bytes slots; the byte
// offset of a slot in the pool is PageOffset(page) + slot * row_bytes (SlotOffset). The cache does
// page and slot accounting only: it never reads or writes row bytes. Insert returns the slot the
// caller's device copy writes; Lookup returns the slots the caller's gather reads.
//
// Two-phase admission. A device copy is asynchronous, so a row must not be served before its
// bytes have landed. ReserveBatch makes *pending* entries: they hold a slot but Lookup reports
// them in pending_positions (never as hits, never in miss_positions, so the caller waits for the
// copy in flight instead of fetching the row a second time), they are never eviction victims, and
// a page holding one is never given back. Commit (after the copy completed) makes them hits;
// Abort (the copy or the fetch failed) drops them and frees their slots for the next admission.
// ResidentRows counts committed rows only. Insert / InsertBatch admit visible at once: they are
// for callers that write the bytes before any lookup can run (single-threaded tests, the
// simulator); the node's miss and refill paths use ReserveBatch + Commit/Abort.
//
// Pages. The cache holds at most budget_pages() pages. It takes pages lazily with
// HbmPool::AllocPage(kEmb) when a size class runs out of free slots and the budget allows, and
// gives pages back with HbmPool::FreePage in Shrink / SetBudgetPages (the caller — the
// MemoryManager — then takes them for the KV side). A page with a pending entry is not given back
// while its copy is in flight: SetBudgetPages may leave the cache over budget by such pages, and
// the excess goes back (coldest pages first, not reported in `freed`) as the reservations
// commit or abort. Classes do not rebalance pages between each
// other: a class that holds no page while the budget is spent gets RESOURCE_EXHAUSTED.
//
// Shrink is metadata-only and O(1) per page after an O(pages held) selection of the coldest
// pages: a page's generation is bumped, which makes every index entry on it stale at once (an
// entry records the generation it was inserted under). Stale entries are dropped lazily: when a
// lookup or insert meets one, when a replacement policy meets one at the cold end of its lists,
// and by a sweep that advances a few entries per call while stale entries exist.
//
// Residency shards (§7). ResidentRows(table, shard) is the number of rows of residency shard
// row / residency_shard_rows that the cache holds (live entries). Every page keeps its own
// per-shard counts; Shrink moves a page's counts to a pending list in O(1); they are subtracted
// from the totals a few at a time on every call and in bounded batches by DrainPending, and
// ResidentRows subtracts the ones still pending for the shard it is asked about, so the answer is
// always exact.
//
// Policies. kLru: one LRU list per size class (hits within the promotion window are not relinked,
// see EmbCacheOptions::promotion_window). kTinyLfu: W-TinyLFU (Einziger et al., 2017): a 1%
// LRU admission window in front of a segmented LRU (20% probation, 80% protected); when the window
// overflows, its oldest entry enters the main cache only if a count-min sketch of recent lookups
// says it is more frequent than the main cache's victim. Every lookup and insert is O(1)
// (amortised for the sketch's periodic halving).
//
// Offsets stay valid until the next call that may evict (Insert, InsertBatch, ReserveBatch,
// Shrink, SetBudgetPages) from any thread; a pending entry's offset stays valid until its Commit
// or Abort; the offsets one InsertBatch returns are distinct and valid
// together (the batch never evicts a row it returned). A caller that reads hit slots later, while
// other admissions and α moves go on (the node sums a request's rows after admitting its misses),
// pins them: a pinned entry stays in the policy's lists, but when the policy names it as the
// victim it goes to the recent end instead (it is being read) and the policy names another; its
// page is not given back (as with a pending entry) until Unpin. Without a pin, the caller orders
// its reads against admissions.
//
// Ownership: the cache borrows the pool and the clock (both outlive it); it owns the pages it
// holds and frees them to the pool when destroyed (after every copy into them has completed).
//
// Thread-safe: one mutex around every call.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/huge_pages.h"
#include "serving_node/core/emb_replacement_policy.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/table_key.h"

namespace hlem::serving {

struct EmbTableSpec {
  uint32_t table_id = 0;
  uint32_t row_bytes = 0;  // bytes of one row (dim * element size); must fit a page
};

struct EmbCacheOptions {
  std::vector<EmbTableSpec> tables;
  uint64_t residency_shard_rows = 4096;  // rows per residency shard (ARCHITECTURE §7)
  // W-TinyLFU by default: on Zipf 1.0 / 0.8 it hits 5.8 / 9.9 points more often than LRU
  // (emb_cache_test), worth far more than its dearer hit path (docs/perf/memory.md).
  EmbPolicy policy = EmbPolicy::kTinyLfu;
  uint32_t budget_pages = 0;  // initial budget; SetBudgetPages moves it
  // kTinyLfu: the count-min sketch's size in keys (16 one-byte counters each; rounded up to a
  // power of two; the counts halve every 10 × sketch_width lookups). 0: one per slot the pool
  // could hold for the size class, clamped to [1024, 2^22].
  uint32_t sketch_width = 0;
  // A hit moves its entry to the most recent end of its list only when at least
  // promotion_window × (the list's capacity) entries were put there since the entry last was;
  // otherwise the entry is among that many most recent ones already and stays put, and the hit
  // writes nothing but the entry's page heat (no relinking of list neighbours, which on a large
  // cache are cold cache lines). An entry is thus never evicted before (1 - promotion_window) ×
  // capacity admissions and promotions followed its last hit: LRU of a slightly smaller
  // capacity at worst. 0: exact LRU order. In [0, 0.5].
  double promotion_window = 1.0 / 16;
};

// Pool byte offset returned for a miss.
inline constexpr uint64_t kEmbMiss = UINT64_MAX;

struct EmbLookupResult {
  std::vector<uint64_t> offsets;  // per position: slot offset, or kEmbMiss (missed or pending)
  std::vector<uint32_t> miss_positions;  // positions that missed and are not pending, ascending
  // Positions whose row is reserved but not committed (its bytes are in flight), ascending. Not
  // hits and not in miss_positions: the caller waits for that copy rather than fetching again.
  std::vector<uint32_t> pending_positions;
  uint32_t hits = 0;
  // With Lookup's `pin`: one handle per hit position, for Unpin.
  std::vector<uint32_t> pinned;
};

// What ReserveBatch did for each row.
struct EmbReservation {
  // Per row: the slot of a row reserved by this call or already resident; kEmbMiss for a row
  // already pending under an earlier reservation (its copy is in flight elsewhere).
  std::vector<uint64_t> offsets;
  // Rows this call reserved, ascending: the caller copies exactly these and then Commits or
  // Aborts them.
  std::vector<uint32_t> reserved_positions;
};

// Cumulative counters, plus the current holdings.
struct EmbCacheStats {
  absl::Time as_of;
  uint64_t lookups = 0;  // rows looked up (the caller deduplicates a batch first)
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t inserts = 0;           // new entries admitted (duplicate inserts not counted)
  uint64_t evictions = 0;         // entries evicted by the replacement policy
  uint64_t shrunk_pages = 0;      // pages given back by Shrink / SetBudgetPages
  uint64_t shrunk_entries = 0;    // entries invalidated with those pages
  uint64_t stale_dropped = 0;     // stale index entries dropped lazily
  uint64_t insert_exhausted = 0;  // inserts answered RESOURCE_EXHAUSTED
  uint64_t pending_lookups = 0;   // looked-up rows found pending (also counted in misses)
  uint64_t reserved = 0;          // pending entries made by ReserveBatch
  uint64_t committed = 0;         // of those, committed (also counted in inserts)
  uint64_t aborted = 0;           // of those, aborted
  uint64_t pages_held = 0;        // now
  uint64_t bytes_held = 0;        // now: pages_held * page_bytes
  uint64_t entries = 0;           // now: live entries, pending ones included
  uint64_t pending_entries = 0;   // now: reserved, neither committed nor aborted
  uint64_t pinned_entries = 0;    // now: pinned by a reader (Lookup with pin, not yet Unpin)
  uint64_t stale_entries = 0;     // now: invalidated entries not yet dropped
  uint32_t budget_pages = 0;      // now
};

class EmbCache {
 public:
  // INVALID_ARGUMENT (naming the field) when there is no table, a table id repeats, a row size is
  // 0 or larger than a page, or residency_shard_rows is 0.
  static absl::StatusOr<std::unique_ptr<EmbCache>> Create(const EmbCacheOptions& options,
                                                          HbmPool& pool, Clock& clock);
  ~EmbCache();
  EmbCache(const EmbCache&) = delete;
  EmbCache& operator=(const EmbCache&) = delete;

  // Pool byte offset of slot `slot` of `page` in a page of rows of `row_bytes` bytes.
  static uint64_t SlotOffset(uint64_t page_bytes, PageId page, uint32_t slot, uint32_t row_bytes) {
    return uint64_t{page} * page_bytes + uint64_t{slot} * row_bytes;
  }
  uint64_t SlotOffset(PageId page, uint32_t slot, uint32_t row_bytes) const {
    return pool_.PageOffset(page) + uint64_t{slot} * row_bytes;
  }
  uint32_t SlotsPerPage(uint32_t row_bytes) const {
    return static_cast<uint32_t>(pool_.page_bytes() / row_bytes);
  }

  // Looks up every row of one table. Hits refresh recency (and frequency); misses are listed.
  // With `pin`, every hit position also pins its row (see the header comment) and adds a handle to
  // out->pinned: the offset stays valid until that handle is given to Unpin. INVALID_ARGUMENT for
  // an unknown table.
  absl::Status Lookup(uint32_t table_id, std::span<const uint64_t> rows, EmbLookupResult* out,
                      bool pin = false);
  // Releases pins by their handles (EmbLookupResult::pinned), each exactly once; a page whose last
  // pin goes is given back if the budget has dropped below the pages held. FAILED_PRECONDITION
  // when some handle holds no pin (the others are released). No hashing: a handle names its
  // entry, which cannot change while pinned.
  absl::Status Unpin(std::span<const uint32_t> pinned);

  // Admits a row and returns the offset of its slot, where the caller writes the row's bytes.
  // A resident row keeps its slot (its recency is refreshed). Takes a never-used slot on a page
  // of the row's size, else a new page within the budget, else the policy's victim of that size.
  // RESOURCE_EXHAUSTED when none of these can be had; INVALID_ARGUMENT for an unknown table.
  // A pending row keeps its slot and stays pending (its reserver commits it).
  absl::StatusOr<uint64_t> Insert(uint32_t table_id, uint64_t row);
  // Insert for many rows of one table; offsets[i] is the slot of rows[i]. No row of the batch
  // evicts another row of the batch. On an error, offsets holds the slots of the rows before the
  // one that failed (they stay admitted).
  absl::Status InsertBatch(uint32_t table_id, std::span<const uint64_t> rows,
                           std::vector<uint64_t>* offsets);

  // Bytes of one row of a table; nullopt for an unknown table.
  std::optional<uint32_t> RowBytes(uint32_t table_id) const;
  // Slots rows of `table_id` can take now without evicting anything: unused and freed slots on
  // pages of its row size, plus a page's worth for every page the budget and the pool still
  // allow (tables of other row sizes compete for those pages). 0 for an unknown table.
  uint64_t FreeSlots(uint32_t table_id) const;

  // Two-phase admission (see the header comment). Reserves a pending slot for every row of one
  // table that is neither resident nor pending; resident rows keep their slot (recency refreshed).
  // Same slot rules and batch guarantee as InsertBatch. The caller deduplicates `rows`. On
  // RESOURCE_EXHAUSTED, `out` describes the rows before the one that failed (their reservations
  // stand and must be committed or aborted); INVALID_ARGUMENT for an unknown table.
  absl::Status ReserveBatch(uint32_t table_id, std::span<const uint64_t> rows, EmbReservation* out);
  // Makes pending rows visible once their bytes have landed. FAILED_PRECONDITION when some row
  // was not pending (the others are still committed); INVALID_ARGUMENT for an unknown table.
  absl::Status Commit(uint32_t table_id, std::span<const uint64_t> rows);
  // Drops pending rows whose copy failed and frees their slots. Errors as Commit.
  absl::Status Abort(uint32_t table_id, std::span<const uint64_t> rows);

  // The slot of a resident or pending row, without counting a lookup or touching recency (refill
  // uses it); *pending (when not null) says which.
  std::optional<uint64_t> Peek(uint32_t table_id, uint64_t row, bool* pending = nullptr) const;

  // Sets the page budget. When the cache holds more pages, the coldest are given back at once, as
  // by Shrink; their ids are appended to `freed` when it is not null.
  void SetBudgetPages(uint32_t pages, std::vector<PageId>* freed = nullptr);
  uint32_t budget_pages() const;

  // Gives back the `n_pages` coldest pages held (all when fewer are held) with every entry in
  // them: their entries become misses, the pages go back to the pool with HbmPool::FreePage and
  // their ids are appended to `freed` (may be null). The budget drops by the same count.
  // Coldness: fewest accesses in an exponentially decaying window, then least recently accessed.
  // Returns the number of pages given back. Cost: O(pages held) to select, O(1) per page.
  uint32_t Shrink(uint32_t n_pages, std::vector<PageId>* freed);

  // Rows of residency shard `shard` (= row / residency_shard_rows) of a table held now. Exact;
  // costs one probe per shrunk page whose counts are not subtracted yet (see DrainPending).
  uint64_t ResidentRows(uint32_t table_id, uint64_t shard);
  // Subtracts up to `max_items` of the shrunk pages' pending (table, shard) counts under one hold
  // of the lock; true while some are left. The MemoryManager calls it every Step, so the
  // subtraction a big Shrink leaves (hundreds of thousands of items) never stalls a lookup.
  bool DrainPending(size_t max_items);
  uint64_t residency_shard_rows() const { return residency_shard_rows_; }

  EmbCacheStats GetStats() const;
  EmbPolicy policy() const { return policy_kind_; }

  // Recounts everything (index, entries, pages, policy segments, residency counters) and compares
  // with the incremental state. INTERNAL with the first difference. O(size); for tests.
  absl::Status CheckInvariants() const;

 private:
  struct SizeClass;
  struct PageMeta;
  using Key = TableKey;
  using ShardCounts = absl::flat_hash_map<Key, uint32_t>;  // (table, shard) -> rows

  EmbCache(const EmbCacheOptions& options, HbmPool& pool, Clock& clock);

  // How InsertLocked admits a new row: visible, visible but detached for the rest of a batch, or
  // pending (flagged detached, outside the policy until Commit).
  enum class Admit : uint8_t { kVisible, kBatch, kPending };
  // Admits a row, or finds it; *was_pending (may be null) says the row was already pending.
  absl::StatusOr<uint64_t> InsertLocked(uint32_t cls, uint32_t table_id, uint64_t row, Admit mode,
                                        bool* was_pending = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reattaches the entries an InsertBatch / ReserveBatch detached.
  void AttachBatchLocked(uint32_t cls) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pending entry of (table, row), or kNil.
  // Commit / Abort: looks up the table, calls fn(size class, entry) under the lock for each row
  // that is pending (taken out of the reservations), counts the others; `op` names the caller.
  absl::Status ResolvePending(const char* op, uint32_t table_id, std::span<const uint64_t> rows,
                              const std::function<void(uint32_t cls, uint32_t e)>& fn);
  uint32_t PendingEntryLocked(uint32_t table_id, uint64_t row) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Gives back pages over budget that no reservation or reader pins.
  void GiveBackExcessLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free slot of class `cls`: fills *page and *slot. RESOURCE_EXHAUSTED when none.
  absl::Status TakeSlotLocked(uint32_t cls, PageId* page, uint32_t* slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(uint32_t entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stale entry still in its policy's lists / already unlinked by the policy.
  void DropStaleLocked(uint32_t entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetStaleLocked(uint32_t entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the stale entries a policy unlinked during its last call.
  void FlushStaleFoundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropPageLocked(PageId page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t ShrinkLocked(uint32_t n_pages, std::vector<PageId>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops up to `n_pages` of the coldest held pages without pending or pinned entries; returns
  // how many.
  uint32_t GiveBackLocked(uint32_t n_pages, std::vector<PageId>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchPageLocked(PageId page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t PageHeatLocked(const PageMeta& meta) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Background-free upkeep: drops a few stale entries and applies a few pending shard counts.
  void UpkeepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrainPendingLocked(size_t max_items) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr size_t kDrainPerQuery = 64;
  Key ShardKey(uint32_t table_id, uint64_t row) const {
    return Key{table_id, row / residency_shard_rows_};
  }

  HbmPool& pool_;
  Clock& clock_;
  const EmbPolicy policy_kind_;
  const uint64_t residency_shard_rows_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, uint32_t> table_class_ ABSL_GUARDED_BY(mu_);  // id -> class
  std::vector<SizeClass> classes_ ABSL_GUARDED_BY(mu_);
  std::vector<PageMeta> pages_ ABSL_GUARDED_BY(mu_);  // by PageId, all pool pages
  std::vector<PageId> held_ ABSL_GUARDED_BY(mu_);     // pages held, any order
  std::unique_ptr<EmbEntryStore> store_ ABSL_GUARDED_BY(mu_);
  // (table, row) -> entry; on huge pages (random probes of a table of hundreds of MB).
  absl::flat_hash_map<Key, uint32_t, absl::Hash<Key>, std::equal_to<Key>,
                      HugePageAllocator<std::pair<const Key, uint32_t>>>
      index_ ABSL_GUARDED_BY(mu_);
  ShardCounts resident_ ABSL_GUARDED_BY(mu_);
  std::vector<ShardCounts> pending_ ABSL_GUARDED_BY(mu_);  // counts of shrunk pages to subtract
  uint32_t budget_pages_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t live_entries_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stale_entries_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pinned_entries_ ABSL_GUARDED_BY(mu_) = 0;  // entries with pins > 0
  // Pending entries. Between calls an entry is detached exactly when it is pending, so the hot
  // path tests `detached`; inside a batch this set tells pending entries from the batch's own.
  absl::flat_hash_set<uint32_t> reserved_ ABSL_GUARDED_BY(mu_);
  uint32_t sweep_pos_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ticks_ ABSL_GUARDED_BY(mu_) = 0;             // accesses, for page recency
  uint32_t heat_epoch_ ABSL_GUARDED_BY(mu_) = 0;        // page heat halves every epoch
  uint64_t epoch_ticks_ ABSL_GUARDED_BY(mu_) = 0;       // accesses in the current epoch
  std::vector<uint32_t> scratch_ ABSL_GUARDED_BY(mu_);  // entries detached by an InsertBatch
  std::vector<uint32_t> scratch_stale_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> scratch_found_ ABSL_GUARDED_BY(mu_);   // Lookup: entry per position
  std::vector<uint64_t> scratch_hashes_ ABSL_GUARDED_BY(mu_);  // Lookup: sketch key per position
  EmbCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::serving
