#include "serving_node/core/hbm_pool.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace hlem::serving {
const char* PageOwnerName(PageOwner owner) {
  switch (owner) {
    case PageOwner::kFree:
      return "free";
    case PageOwner::kKv:
      return "kv";
    case PageOwner::kEmb:
      return "emb";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<HbmPool>> HbmPool::Create(const HbmPoolOptions& options) {
  if (options.page_bytes == 0 || options.page_bytes % 256 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool.page_bytes: must be a positive multiple of 256, got ", options.page_bytes));
  }
  uint64_t pages = options.pool_bytes / options.page_bytes;
  if (pages == 0 || pages > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool.bytes: ", options.pool_bytes, " bytes make ", pages, " pages of ",
                     options.page_bytes, " bytes; need 1 .. 2^31 pages"));
  }
  return std::unique_ptr<HbmPool>(new HbmPool(static_cast<uint32_t>(pages), options.page_bytes));
}

HbmPool::HbmPool(uint32_t num_pages, uint64_t page_bytes)
    : num_pages_(num_pages),
      page_bytes_(page_bytes),
      owner_(num_pages, PageOwner::kFree),
      next_free_(num_pages) {
  // Low page ids first, so a fresh pool hands out pages in address order.
  for (uint32_t p = 0; p < num_pages; ++p) next_free_[p] = p + 1 < num_pages ? p + 1 : kNoPage;
  free_head_ = 0;
  count_[static_cast<int>(PageOwner::kFree)] = num_pages;
}

absl::StatusOr<PageId> HbmPool::AllocPage(PageOwner owner) {
  if (owner == PageOwner::kFree) return absl::InvalidArgumentError("AllocPage for kFree");
  absl::MutexLock lock(&mu_);
  if (free_head_ == kNoPage) return absl::ResourceExhaustedError("HBM pool: no free page");
  PageId page = free_head_;
  free_head_ = next_free_[page];
  next_free_[page] = kNoPage;
  owner_[page] = owner;
  --count_[static_cast<int>(PageOwner::kFree)];
  ++count_[static_cast<int>(owner)];
  return page;
}

void HbmPool::FreePage(PageId page) {
  absl::MutexLock lock(&mu_);
  if (page >= num_pages_)
    CheckFailed("hbm_pool", absl::StrCat("FreePage(", page, ") out of range"));
  PageOwner was = owner_[page];
  if (was == PageOwner::kFree)
    CheckFailed("hbm_pool", absl::StrCat("FreePage(", page, ") of a free page"));
  owner_[page] = PageOwner::kFree;
  next_free_[page] = free_head_;
  free_head_ = page;
  --count_[static_cast<int>(was)];
  ++count_[static_cast<int>(PageOwner::kFree)];
}

void HbmPool::Transfer(PageId page, PageOwner from, PageOwner to) {
  absl::MutexLock lock(&mu_);
  if (page >= num_pages_ || owner_[page] != from || from == PageOwner::kFree ||
      to == PageOwner::kFree) {
    CheckFailed("hbm_pool",
                absl::StrCat("Transfer(", page, ", ", PageOwnerName(from), " -> ",
                             PageOwnerName(to), ") of a page owned by ",
                             page < num_pages_ ? PageOwnerName(owner_[page]) : "nobody"));
  }
  owner_[page] = to;
  --count_[static_cast<int>(from)];
  ++count_[static_cast<int>(to)];
}

PageOwner HbmPool::owner(PageId page) const {
  absl::MutexLock lock(&mu_);
  return page < num_pages_ ? owner_[page] : PageOwner::kFree;
}

uint32_t HbmPool::free_pages() const { return pages_owned(PageOwner::kFree); }

uint32_t HbmPool::pages_owned(PageOwner owner) const {
  absl::MutexLock lock(&mu_);
  return count_[static_cast<int>(owner)];
}

absl::Status HbmPool::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  std::vector<bool> on_list(num_pages_, false);
  uint32_t listed = 0;
  for (PageId p = free_head_; p != kNoPage; p = next_free_[p]) {
    if (p >= num_pages_) return absl::InternalError(absl::StrCat("free list holds page ", p));
    if (on_list[p]) return absl::InternalError(absl::StrCat("page ", p, " twice on the free list"));
    if (owner_[p] != PageOwner::kFree) {
      return absl::InternalError(
          absl::StrCat("page ", p, " on the free list but owned by ", PageOwnerName(owner_[p])));
    }
    on_list[p] = true;
    ++listed;
  }
  uint32_t counted[3] = {0, 0, 0};
  for (PageId p = 0; p < num_pages_; ++p) {
    ++counted[static_cast<int>(owner_[p])];
    if (owner_[p] == PageOwner::kFree && !on_list[p]) {
      return absl::InternalError(absl::StrCat("free page ", p, " missing from the free list"));
    }
  }
  for (int o = 0; o < 3; ++o) {
    if (counted[o] != count_[o]) {
      return absl::InternalError(absl::StrCat(PageOwnerName(static_cast<PageOwner>(o)), " count ",
                                              count_[o], " but ", counted[o],
                                              " pages have that owner"));
    }
  }
  if (listed != count_[0]) return absl::InternalError("free list length != free count");
  return absl::OkStatus();
}

}  // namespace hlem::serving
