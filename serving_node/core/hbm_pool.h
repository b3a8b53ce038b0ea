#pragma once
// One device memory pool cut into fixed-size pages, shared by the KV cache and the EMB cache
// (ARCHITECTURE §4). The pool only does page accounting: which pages are free, which belong to
// the KV side, which to the EMB side. Moving the α boundary is moving pages between owners, never
// copying their bytes. AllocPage/FreePage are O(1) (an intrusive free list).
//
// The bytes themselves live in a Device (host arena or cudaMalloc); a page's bytes are at
// base + PageOffset(page). Thread-safe: one short critical section per call.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace hlem::serving {

using PageId = uint32_t;
inline constexpr PageId kNoPage = UINT32_MAX;

enum class PageOwner : uint8_t { kFree = 0, kKv = 1, kEmb = 2 };
const char* PageOwnerName(PageOwner owner);

struct HbmPoolOptions {
  uint64_t pool_bytes = 0;  // rounded down to whole pages
  uint64_t page_bytes = 2 << 20;
};

class HbmPool {
 public:
  // INVALID_ARGUMENT when the page size is 0 or not a multiple of 256, or the pool holds no page
  // or more than 2^31 pages.
  static absl::StatusOr<std::unique_ptr<HbmPool>> Create(const HbmPoolOptions& options);

  uint32_t num_pages() const { return num_pages_; }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t PageOffset(PageId page) const { return uint64_t{page} * page_bytes_; }

  // Takes a free page for `owner` (kKv or kEmb); RESOURCE_EXHAUSTED when none is free.
  absl::StatusOr<PageId> AllocPage(PageOwner owner);
  // Returns a page to the free list. CHECK-fails on a page that is already free or out of range
  // (a double free is a bug, not an input error).
  void FreePage(PageId page);
  // Moves a page straight from one owner to the other (no free-list round trip).
  void Transfer(PageId page, PageOwner from, PageOwner to);

  PageOwner owner(PageId page) const;
  uint32_t free_pages() const;
  uint32_t pages_owned(PageOwner owner) const;

  // Every page is in exactly one place: free pages are on the free list exactly once, the counts
  // per owner add up to num_pages. INTERNAL with the first violation found.
  absl::Status CheckInvariants() const;

 private:
  HbmPool(uint32_t num_pages, uint64_t page_bytes);

  const uint32_t num_pages_;
  const uint64_t page_bytes_;
  mutable absl::Mutex mu_;
  std::vector<PageOwner> owner_ ABSL_GUARDED_BY(mu_);
  std::vector<PageId> next_free_ ABSL_GUARDED_BY(mu_);  // intrusive free list
  PageId free_head_ ABSL_GUARDED_BY(mu_) = kNoPage;
  uint32_t count_[3] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
};

}  // namespace hlem::serving
