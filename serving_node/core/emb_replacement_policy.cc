#include "serving_node/core/emb_replacement_policy.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace hlem::serving {
namespace {

// An intrusive doubly linked list over EmbEntry::prev/next; head is the most recent end.
// `pushes` counts PushFronts; an entry's stamp is the count at its own, so at most
// pushes - stamp entries are ahead of it (only PushFront puts an entry ahead of another).
struct EntryList {
  EntryId head = kNil;
  EntryId tail = kNil;
  uint32_t pushes = 0;
  bool empty() const { return head == kNil; }
  void PushFront(EmbEntries& v, EntryId e) {
    v[e].stamp = ++pushes;
    v[e].prev = kNil;
    v[e].next = head;
    if (head != kNil) {
      v[head].prev = e;
    } else {
      tail = e;
    }
    head = e;
  }
  void Unlink(EmbEntries& v, EntryId e) {
    EmbEntry& x = v[e];
    if (x.prev != kNil) {
      v[x.prev].next = x.next;
    } else {
      head = x.next;
    }
    if (x.next != kNil) {
      v[x.next].prev = x.prev;
    } else {
      tail = x.prev;
    }
    x.prev = x.next = kNil;
  }
  // Moves e to the front unless fewer than `window` entries were pushed since e was: then e is
  // among the first `window` already and stays where it is (no write to its neighbours).
  void Promote(EmbEntries& v, EntryId e, uint64_t window) {
    if (uint32_t{pushes - v[e].stamp} < window) return;
    Unlink(v, e);
    PushFront(v, e);
  }
  // Unlinks stale entries at the cold end into store.stale_found.
  void PurgeStaleTail(EmbEntryStore& s) {
    while (tail != kNil && s.IsStale(tail)) {
      EntryId t = tail;
      Unlink(s.entries, t);
      s.stale_found.push_back(t);
    }
  }
  // Walks the list checking its links; counts entries, live ones per segment.
  absl::Status Walk(const EmbEntryStore& s, uint64_t* listed, uint64_t* live) const {
    EntryId prev = kNil;
    for (EntryId e = head; e != kNil; e = s.entries[e].next) {
      if (s.entries[e].prev != prev) return absl::InternalError("policy list: bad prev link");
      if (!s.entries[e].in_use) return absl::InternalError("policy list holds a free entry");
      ++*listed;
      if (!s.IsStale(e)) ++*live;
      prev = e;
    }
    if (prev != tail) return absl::InternalError("policy list: bad tail");
    return absl::OkStatus();
  }
};

// A hit within the promotion window (see EmbCacheOptions::promotion_window) is not relinked.
uint64_t PromotionWindow(uint64_t list_capacity, double fraction) {
  return static_cast<uint64_t>(static_cast<double>(list_capacity) * fraction);
}

class LruPolicy final : public EmbReplacementPolicy {
 public:
  LruPolicy(EmbEntryStore& store, double promotion_window)
      : s_(store), promotion_window_(promotion_window) {}
  void Insert(EntryId e) override { list_.PushFront(s_.entries, e); }
  void Touch(EntryId e) override { list_.Promote(s_.entries, e, window_); }
  void Remove(EntryId e) override { list_.Unlink(s_.entries, e); }
  void RemoveStale(EntryId e) override { list_.Unlink(s_.entries, e); }
  void Detach(EntryId e) override { list_.Unlink(s_.entries, e); }
  void Attach(EntryId e) override { list_.PushFront(s_.entries, e); }
  void DropPage(PageId) override {}
  void SetCapacity(uint64_t slots) override { window_ = PromotionWindow(slots, promotion_window_); }
  EntryId Victim() override {
    list_.PurgeStaleTail(s_);
    return list_.tail;
  }
  absl::Status Check(uint64_t* listed) const override {
    uint64_t live = 0;
    return list_.Walk(s_, listed, &live);
  }

 private:
  EmbEntryStore& s_;
  const double promotion_window_;
  uint64_t window_ = 0;
  EntryList list_;
};

// A count-min sketch of 4 rows of saturating 4-bit-range counters (kept in bytes), halved every
// 10 * width increments so that it follows recent popularity (TinyLFU's reset). Blocked: the 4
// counters of a key lie in one 64-byte block (one 16-byte lane per row), so an increment or an
// estimate touches one cache line instead of four, as Caffeine's sketch does. A block's lanes
// are shared by the keys of the block, so the rows' errors are correlated: the sketch has
// 16 × width counters (width / 4 blocks), which on the Zipf tests of emb_cache_test matches
// the hit rate of 4 independent rows of width counters or beats it (docs/perf/memory.md).
class FrequencySketch {
 public:
  explicit FrequencySketch(uint32_t width)
      : blocks_(std::max<uint64_t>(1, uint64_t{width} / 4)),
        counters_(64 * blocks_),
        sample_(10 * uint64_t{width}) {}
  void Increment(uint64_t h) {
    bool added = false;
    for (uint32_t i = 0; i < 4; ++i) {
      uint8_t& c = counters_[Index(h, i)];
      if (c < 15) {
        ++c;
        added = true;
      }
    }
    if (added && ++additions_ >= sample_) {
      for (uint8_t& c : counters_) c >>= 1;
      additions_ /= 2;
    }
  }
  void Prefetch(uint64_t h) const { __builtin_prefetch(&counters_[Block(h)], 1); }
  uint32_t Estimate(uint64_t h) const {
    uint32_t m = 15;
    for (uint32_t i = 0; i < 4; ++i) m = std::min<uint32_t>(m, counters_[Index(h, i)]);
    return m;
  }

 private:
  // blocks_ is a power of two (width is): the block from the low bits of h, the counter of row i
  // from 4 bits of a second hash.
  size_t Block(uint64_t h) const { return (h & (blocks_ - 1)) * 64; }
  size_t Index(uint64_t h, uint32_t i) const {
    return Block(h) + i * 16 + ((Mix64(h) >> (4 * i + 32)) & 15);
  }
  const uint64_t blocks_;
  std::vector<uint8_t, HugePageAllocator<uint8_t>> counters_;
  const uint64_t sample_;
  uint64_t additions_ = 0;
};

// W-TinyLFU: window LRU (1%) -> [TinyLFU filter] -> segmented LRU (probation 20%, protected 80%).
class TinyLfuPolicy final : public EmbReplacementPolicy {
 public:
  enum Segment : uint8_t { kWindow = 0, kProbation = 1, kProtected = 2 };

  TinyLfuPolicy(EmbEntryStore& store, uint32_t num_pages, uint32_t sketch_width,
                double promotion_window)
      : s_(store),
        promotion_window_(promotion_window),
        page_counts_(num_pages),
        sketch_(sketch_width) {
    SetCapacity(0);
  }
  void Insert(EntryId e) override {
    s_.entries[e].segment = kWindow;
    lists_[kWindow].PushFront(s_.entries, e);
    Count(e, kWindow, +1);
    // While a slot is still free, what overflows the window enters probation unfiltered; once
    // the entry just inserted took the last one, the window stays one over its target and the
    // next Victim makes the window's oldest entry compete with the main cache's victim.
    if (sizes_[kWindow] > window_target_ &&
        sizes_[kWindow] + sizes_[kProbation] + sizes_[kProtected] < capacity_) {
      lists_[kWindow].PurgeStaleTail(s_);
      if (lists_[kWindow].tail != kNil) Move(lists_[kWindow].tail, kWindow, kProbation);
    }
  }
  void Touch(EntryId e) override {
    EmbEntry& x = s_.entries[e];
    if (x.segment != kProbation) {
      lists_[x.segment].Promote(s_.entries, e, windows_[x.segment]);
      return;
    }
    Move(e, kProbation, kProtected);
    // Keep protected near its target: its coldest entries go back to probation.
    for (int i = 0; i < 2 && sizes_[kProtected] > protected_target_; ++i) {
      lists_[kProtected].PurgeStaleTail(s_);
      if (lists_[kProtected].tail == kNil) break;
      Move(lists_[kProtected].tail, kProtected, kProbation);
    }
  }
  void Remove(EntryId e) override {
    uint8_t seg = s_.entries[e].segment;
    lists_[seg].Unlink(s_.entries, e);
    Count(e, seg, -1);
  }
  void RemoveStale(EntryId e) override { lists_[s_.entries[e].segment].Unlink(s_.entries, e); }
  void Detach(EntryId e) override {
    lists_[s_.entries[e].segment].Unlink(s_.entries, e);
    ++detached_[s_.entries[e].segment];
  }
  void Attach(EntryId e) override {
    lists_[s_.entries[e].segment].PushFront(s_.entries, e);
    --detached_[s_.entries[e].segment];
  }
  void DropPage(PageId page) override {
    for (int seg = 0; seg < 3; ++seg) sizes_[seg] -= page_counts_[page][seg];
    page_counts_[page] = {0, 0, 0};
  }
  void SetCapacity(uint64_t slots) override {
    capacity_ = slots;
    window_target_ = std::max<uint64_t>(1, slots / 100);
    protected_target_ = (slots > window_target_ ? slots - window_target_ : 0) * 8 / 10;
    windows_[kWindow] = PromotionWindow(window_target_, promotion_window_);
    windows_[kProtected] = PromotionWindow(protected_target_, promotion_window_);
  }
  void RecordAccesses(std::span<const uint64_t> key_hashes) override {
    // The counters of a key are four random bytes of a sketch far larger than the caches:
    // prefetch the keys a few positions ahead so that their misses overlap.
    constexpr size_t kAhead = 8;
    for (size_t i = 0; i < key_hashes.size(); ++i) {
      if (i + kAhead < key_hashes.size()) sketch_.Prefetch(key_hashes[i + kAhead]);
      sketch_.Increment(key_hashes[i]);
    }
  }

  EntryId Victim() override {
    for (EntryList& l : lists_) l.PurgeStaleTail(s_);
    EntryId main = !lists_[kProbation].empty() ? lists_[kProbation].tail : lists_[kProtected].tail;
    EntryList& window = lists_[kWindow];
    if (!window.empty() && (sizes_[kWindow] > window_target_ || main == kNil)) {
      EntryId candidate = window.tail;
      if (main == kNil) return candidate;
      if (Frequency(candidate) <= Frequency(main)) return candidate;
      Move(candidate, kWindow, kProbation);  // admitted to the main cache
      return main;
    }
    return main != kNil ? main : window.tail;
  }

  absl::Status Check(uint64_t* listed) const override {
    uint64_t page_sum[3] = {0, 0, 0};
    for (const auto& c : page_counts_) {
      for (int seg = 0; seg < 3; ++seg) page_sum[seg] += c[seg];
    }
    for (int seg = 0; seg < 3; ++seg) {
      uint64_t live = 0;
      absl::Status st = lists_[seg].Walk(s_, listed, &live);
      if (!st.ok()) return st;
      if (live + detached_[seg] != sizes_[seg] || page_sum[seg] != sizes_[seg]) {
        return absl::InternalError(absl::StrCat("tinylfu segment ", seg, " size ", sizes_[seg],
                                                " but ", live, " live listed and ", detached_[seg],
                                                " detached, pages say ", page_sum[seg]));
      }
    }
    return absl::OkStatus();
  }

 private:
  uint32_t Frequency(EntryId e) const {
    return sketch_.Estimate(EmbKeyHash(s_.entries[e].table_id, s_.entries[e].row));
  }
  void Count(EntryId e, uint8_t seg, int delta) {
    sizes_[seg] += delta;
    page_counts_[s_.entries[e].page][seg] += delta;
  }
  void Move(EntryId e, Segment from, Segment to) {
    lists_[from].Unlink(s_.entries, e);
    Count(e, from, -1);
    s_.entries[e].segment = to;
    lists_[to].PushFront(s_.entries, e);
    Count(e, to, +1);
  }

  EmbEntryStore& s_;
  const double promotion_window_;
  uint64_t windows_[3] = {0, 0, 0};  // promotion window per segment (probation: none)
  EntryList lists_[3];
  uint64_t sizes_[3] = {0, 0, 0};                     // live entries, attached or detached
  uint64_t detached_[3] = {0, 0, 0};                  // of those, detached
  std::vector<std::array<uint32_t, 3>> page_counts_;  // live entries per page and segment
  uint64_t capacity_ = 0;                             // slots of the size class
  uint64_t window_target_ = 1;
  uint64_t protected_target_ = 0;
  FrequencySketch sketch_;
};

uint32_t SketchWidth(uint32_t configured, uint64_t pool_slots) {
  uint64_t want = configured != 0 ? configured : std::clamp<uint64_t>(pool_slots, 1024, 1 << 22);
  uint32_t width = 1;
  while (width < want && width < (1u << 30)) width <<= 1;
  return width;
}

}  // namespace

const char* EmbPolicyName(EmbPolicy policy) {
  switch (policy) {
    case EmbPolicy::kLru:
      return "lru";
    case EmbPolicy::kTinyLfu:
      return "tinylfu";
  }
  return "?";
}

std::unique_ptr<EmbReplacementPolicy> MakeEmbReplacementPolicy(EmbPolicy kind, EmbEntryStore& store,
                                                               uint32_t num_pages,
                                                               uint64_t pool_slots,
                                                               uint32_t sketch_width,
                                                               double promotion_window) {
  if (kind == EmbPolicy::kTinyLfu) {
    return std::make_unique<TinyLfuPolicy>(store, num_pages, SketchWidth(sketch_width, pool_slots),
                                           promotion_window);
  }
  return std::make_unique<LruPolicy>(store, promotion_window);
}

}  // namespace hlem::serving
