#pragma once
// Replacement policies of the EMB cache, and the entry store they share with it. A policy sees
// entries by id (EmbEntryStore) and decides which live entry of one size class to evict next.
// Not thread-safe: the EmbCache calls it under its own lock.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/huge_pages.h"
#include "common/rng.h"
#include "serving_node/core/hbm_pool.h"

namespace hlem::serving {

enum class EmbPolicy : uint8_t { kLru = 0, kTinyLfu = 1 };
const char* EmbPolicyName(EmbPolicy policy);

using EntryId = uint32_t;
inline constexpr EntryId kNil = UINT32_MAX;

// One index entry. Lives in EmbEntryStore::entries until it is evicted or, once stale, dropped;
// `gen` is the generation of `page` when the entry was made.
struct EmbEntry {
  // The fields a hit reads come first (21 bytes), so that two prefetches cover them wherever the
  // 48-byte entry falls across cache lines.
  PageId page = kNoPage;
  uint32_t slot = 0;
  uint32_t gen = 0;
  uint32_t stamp = 0;   // the list's push count when the entry was last pushed to its front
  uint16_t cls = 0;     // size class whose policy lists hold the entry
  uint8_t segment = 0;  // policy use
  bool in_use = false;
  bool detached = false;  // taken out of the policy lists for the rest of an InsertBatch
  uint16_t pins = 0;      // readers between EmbCache::Lookup(pin) and Unpin: passed over as victim
  uint64_t row = 0;
  uint32_t table_id = 0;
  EntryId prev = kNil;  // policy list links
  EntryId next = kNil;
};
inline constexpr size_t kEmbEntryHotBytes = offsetof(EmbEntry, pins) + sizeof(uint16_t);

using EmbEntries = std::vector<EmbEntry, HugePageAllocator<EmbEntry>>;  // on huge pages

struct EmbEntryStore {
  EmbEntries entries;
  std::vector<EntryId> free;
  std::vector<uint32_t> page_gen;    // by PageId
  std::vector<EntryId> stale_found;  // unlinked by a policy, for the cache to drop

  bool IsStale(EntryId e) const { return entries[e].gen != page_gen[entries[e].page]; }
  EntryId Alloc() {
    EntryId e;
    if (!free.empty()) {
      e = free.back();
      free.pop_back();
    } else {
      e = static_cast<EntryId>(entries.size());
      entries.emplace_back();
    }
    entries[e].in_use = true;
    return e;
  }
  void Release(EntryId e) {
    entries[e] = EmbEntry();
    free.push_back(e);
  }
};

// How one size class picks victims. Entries enter with Insert, are refreshed by Touch and leave
// by Remove (live) or RemoveStale (their page was shrunk; the page's counts already left with
// DropPage). Stale entries met at the cold end go to store.stale_found.
class EmbReplacementPolicy {
 public:
  virtual ~EmbReplacementPolicy() = default;
  virtual void Insert(EntryId e) = 0;
  virtual void Touch(EntryId e) = 0;
  virtual void Remove(EntryId e) = 0;
  virtual void RemoveStale(EntryId e) = 0;
  // Takes a live entry out of the lists (not evictable) until Attach puts it back, most recent.
  virtual void Detach(EntryId e) = 0;
  virtual void Attach(EntryId e) = 0;
  virtual void DropPage(PageId page) = 0;
  virtual void SetCapacity(uint64_t slots) = 0;
  // Counts lookups of keys (EmbKeyHash) for a frequency-aware policy; no-op otherwise.
  virtual void RecordAccesses(std::span<const uint64_t> /*key_hashes*/) {}
  // The live entry to evict next (still linked; the caller Removes it), or kNil.
  virtual EntryId Victim() = 0;
  virtual absl::Status Check(uint64_t* listed) const = 0;
};

// The key the TinyLFU sketch counts a (table, row) under.
inline uint64_t EmbKeyHash(uint32_t table_id, uint64_t row) { return KeyedHash(table_id, row); }

// A policy of `kind` for one size class; `pool_slots` sizes the TinyLFU sketch when
// `sketch_width` is 0; `promotion_window` as EmbCacheOptions::promotion_window.
std::unique_ptr<EmbReplacementPolicy> MakeEmbReplacementPolicy(EmbPolicy kind, EmbEntryStore& store,
                                                               uint32_t num_pages,
                                                               uint64_t pool_slots,
                                                               uint32_t sketch_width,
                                                               double promotion_window);

}  // namespace hlem::serving
