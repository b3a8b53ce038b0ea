#include "serving_node/core/emb_replacement_policy.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace hlem::serving {
namespace {

// An intrusive doubly linked list over EmbEntry::prev/next; head is the most recent end.
struct EntryList {
  EntryId head = kNil;
  EntryId tail = kNil;
  bool empty() const { return head == kNil; }
  void PushFront(std::vector<EmbEntry>& v, EntryId e) {
    v[e].prev = kNil;
    v[e].next = head;
    if (head != kNil) {
      v[head].prev = e;
    } else {
      tail = e;
    }
    head = e;
  }
  void Unlink(std::vector<EmbEntry>& v, EntryId e) {
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

class LruPolicy final : public EmbReplacementPolicy {
 public:
  explicit LruPolicy(EmbEntryStore& store) : s_(store) {}
  void Insert(EntryId e) override { list_.PushFront(s_.entries, e); }
  void Touch(EntryId e) override {
    list_.Unlink(s_.entries, e);
    list_.PushFront(s_.entries, e);
  }
  void Remove(EntryId e) override { list_.Unlink(s_.entries, e); }
  void RemoveStale(EntryId e) override { list_.Unlink(s_.entries, e); }
  void Detach(EntryId e) override { list_.Unlink(s_.entries, e); }
  void Attach(EntryId e) override { list_.PushFront(s_.entries, e); }
  void DropPage(PageId) override {}
  void SetCapacity(uint64_t) override {}
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
  EntryList list_;
};

// A count-min sketch of 4 rows of saturating 4-bit-range counters (kept in bytes), halved every
// 10 * width increments so that it follows recent popularity (TinyLFU's reset).
class FrequencySketch {
 public:
  explicit FrequencySketch(uint32_t width)
      : width_(width),
        mask_(width - 1),
        counters_(4 * size_t{width}),
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
  uint32_t Estimate(uint64_t h) const {
    uint32_t m = 15;
    for (uint32_t i = 0; i < 4; ++i) m = std::min<uint32_t>(m, counters_[Index(h, i)]);
    return m;
  }

 private:
  size_t Index(uint64_t h, uint32_t i) const {
    uint64_t h2 = Mix64(h) | 1;
    return size_t{i} * width_ + ((h + i * h2) & mask_);
  }
  const uint32_t width_;
  const uint64_t mask_;
  std::vector<uint8_t> counters_;
  const uint64_t sample_;
  uint64_t additions_ = 0;
};

// W-TinyLFU: window LRU (1%) -> [TinyLFU filter] -> segmented LRU (probation 20%, protected 80%).
class TinyLfuPolicy final : public EmbReplacementPolicy {
 public:
  enum Segment : uint8_t { kWindow = 0, kProbation = 1, kProtected = 2 };

  TinyLfuPolicy(EmbEntryStore& store, uint32_t num_pages, uint32_t sketch_width)
      : s_(store), page_counts_(num_pages), sketch_(sketch_width) {
    SetCapacity(0);
  }
  void Insert(EntryId e) override {
    s_.entries[e].segment = kWindow;
    lists_[kWindow].PushFront(s_.entries, e);
    Count(e, kWindow, +1);
    // While the cache is not full, what overflows the window enters probation unfiltered; once
    // it is full, Victim makes the window's oldest entry compete with the main cache's victim.
    if (sizes_[kWindow] > window_target_ &&
        sizes_[kWindow] + sizes_[kProbation] + sizes_[kProtected] <= capacity_) {
      lists_[kWindow].PurgeStaleTail(s_);
      if (lists_[kWindow].tail != kNil) Move(lists_[kWindow].tail, kWindow, kProbation);
    }
  }
  void Touch(EntryId e) override {
    EmbEntry& x = s_.entries[e];
    if (x.segment != kProbation) {
      lists_[x.segment].Unlink(s_.entries, e);
      lists_[x.segment].PushFront(s_.entries, e);
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
  void Detach(EntryId e) override { lists_[s_.entries[e].segment].Unlink(s_.entries, e); }
  void Attach(EntryId e) override { lists_[s_.entries[e].segment].PushFront(s_.entries, e); }
  void DropPage(PageId page) override {
    for (int seg = 0; seg < 3; ++seg) sizes_[seg] -= page_counts_[page][seg];
    page_counts_[page] = {0, 0, 0};
  }
  void SetCapacity(uint64_t slots) override {
    capacity_ = slots;
    window_target_ = std::max<uint64_t>(1, slots / 100);
    protected_target_ = (slots > window_target_ ? slots - window_target_ : 0) * 8 / 10;
  }
  void RecordAccess(uint64_t key_hash) override { sketch_.Increment(key_hash); }

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
      if (live != sizes_[seg] || page_sum[seg] != sizes_[seg]) {
        return absl::InternalError(absl::StrCat("tinylfu segment ", seg, " size ", sizes_[seg],
                                                " but ", live, " live listed, pages say ",
                                                page_sum[seg]));
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
  EntryList lists_[3];
  uint64_t sizes_[3] = {0, 0, 0};                     // live entries, attached or detached
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
                                                               uint32_t sketch_width) {
  if (kind == EmbPolicy::kTinyLfu) {
    return std::make_unique<TinyLfuPolicy>(store, num_pages, SketchWidth(sketch_width, pool_slots));
  }
  return std::make_unique<LruPolicy>(store);
}

}  // namespace hlem::serving
