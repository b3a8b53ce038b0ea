#include "serving_node/core/kv_cache.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace hlem::serving {
namespace {

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace

uint64_t KvHash(std::span<const uint64_t> tokens, uint64_t hash) {
  for (uint64_t token : tokens) hash = KvHashExtend(hash, token);
  return hash;
}

void KvScatterTargets(std::span<const KvSlotRun> runs, uint64_t page_bytes,
                      std::vector<uint64_t>* page_offsets, std::vector<uint32_t>* slots) {
  page_offsets->clear();
  slots->clear();
  for (const KvSlotRun& run : runs) {
    for (uint32_t i = 0; i < run.tokens; ++i) {
      page_offsets->push_back(uint64_t{run.page} * page_bytes);
      slots->push_back(run.first_slot + i);
    }
  }
}

absl::StatusOr<KvPageLayout> KvPageLayout::Make(const KvCacheOptions& options,
                                                uint64_t page_bytes) {
  if (options.layers == 0 || options.kv_dim == 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache: layers (", options.layers,
                                                   ") and kv_dim (", options.kv_dim,
                                                   ") must be positive"));
  }
  const uint32_t d = options.dtype_bytes;
  if (d != 1 && d != 2 && d != 4 && d != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache.dtype_bytes: must be 1, 2, 4 or 8, got ", d));
  }
  const uint64_t token_bytes = uint64_t{options.layers} * 2 * options.kv_dim * d;
  const uint64_t page_tokens = page_bytes / token_bytes;
  if (page_tokens == 0 || page_tokens > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache: a page of ", page_bytes, " bytes holds ", page_tokens,
                     " tokens of ", token_bytes, " bytes (layers x 2 x kv_dim x dtype_bytes)"));
  }
  KvPageLayout layout;
  layout.layers = options.layers;
  layout.kv_dim = options.kv_dim;
  layout.dtype_bytes = d;
  layout.page_bytes = page_bytes;
  layout.page_tokens = static_cast<uint32_t>(page_tokens);
  return layout;
}

// Invariants (CheckInvariants): pages.size() == ceil(n / page_tokens) with n = len, or the
// reserved length while an append is in flight, so only the last page can be partly filled;
// page_start_hash[i] is the hash of tokens [0, i·page_tokens); retired pages exist only while
// pinned; an append in flight holds a pin; on the LRU list iff unpinned with pages.
struct KvCache::Entry {
  uint64_t user = 0;
  uint64_t len = 0;
  uint64_t hash = kKvHashSeed;
  std::vector<PageId> pages;
  std::vector<uint64_t> page_start_hash;
  std::vector<PageId> retired;
  absl::Time last_access;
  uint32_t pins = 0;
  bool appending = false;         // an append is in flight (and holds one of the pins)
  bool append_cancelled = false;  // ... but the KV was dropped meanwhile
  KvPrefix append_prefix;         // ... and will make this the prefix
  bool in_lru = false;
  Entry* prev = nullptr;
  Entry* next = nullptr;
};

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheOptions& options,
                                                         HbmPool& pool, ResidencyEventLog* events,
                                                         Clock& clock) {
  ASSIGN_OR_RETURN(KvPageLayout layout, KvPageLayout::Make(options, pool.page_bytes()));
  if (options.reclaim_min_idle < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kv_cache.reclaim_min_idle: must not be negative");
  }
  return std::unique_ptr<KvCache>(new KvCache(options, layout, pool, events, clock));
}

KvCache::KvCache(const KvCacheOptions& options, const KvPageLayout& layout, HbmPool& pool,
                 ResidencyEventLog* events, Clock& clock)
    : options_(options),
      layout_(layout),
      pool_(pool),
      events_(events),
      clock_(clock),
      budget_pages_(options.budget_pages) {}

KvCache::~KvCache() {
  absl::MutexLock lock(&mu_);
  for (auto& [user, e] : users_) {
    for (PageId p : e->pages) pool_.FreePage(p);
    for (PageId p : e->retired) pool_.FreePage(p);
  }
}

KvCache::Entry* KvCache::Find(uint64_t user) const {
  auto it = users_.find(user);
  return it == users_.end() ? nullptr : it->second.get();
}

void KvCache::LruRemove(Entry* e) {
  if (!e->in_lru) return;
  (e->prev ? e->prev->next : lru_head_) = e->next;
  (e->next ? e->next->prev : lru_tail_) = e->prev;
  e->prev = e->next = nullptr;
  e->in_lru = false;
  lru_pages_ -= e->pages.size();
}

void KvCache::LruPushBack(Entry* e) {
  e->prev = lru_tail_;
  e->next = nullptr;
  (lru_tail_ ? lru_tail_->next : lru_head_) = e;
  lru_tail_ = e;
  e->in_lru = true;
  lru_pages_ += e->pages.size();
}

void KvCache::Touch(Entry* e) {
  e->last_access = clock_.Now();
  LruRemove(e);
  if (e->pins == 0 && !e->pages.empty()) LruPushBack(e);
}

bool KvCache::Touch(uint64_t user) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(user);
  if (e == nullptr || e->pages.empty()) return false;
  Touch(e);
  return true;
}

void KvCache::Publish(ResidencyEvent::Kind kind, uint64_t user, uint64_t tokens,
                      ResidencyEvent::Cause cause) {
  if (events_ == nullptr) return;
  ResidencyEvent event;
  event.kind = kind;
  event.user_id = user;
  event.tokens = tokens;
  event.cause = cause;
  events_->Publish(event);
}

void KvCache::MaybeErase(Entry* e) {
  if (e->pins == 0 && e->pages.empty() && e->retired.empty()) users_.erase(e->user);
}

void KvCache::DropKv(Entry* e, EvictReason reason, std::vector<PageId>* keep_pages) {
  LruRemove(e);
  if (keep_pages != nullptr) {
    keep_pages->insert(keep_pages->end(), e->pages.begin(), e->pages.end());
    stats_.pages_held -= e->pages.size();
  } else if (e->pins > 0) {
    // A request of this user may still be reading these pages: keep them until the last Unpin.
    e->retired.insert(e->retired.end(), e->pages.begin(), e->pages.end());
  } else {
    for (PageId p : e->pages) pool_.FreePage(p);
    stats_.pages_held -= e->pages.size();
  }
  const bool had_kv = e->len > 0;
  e->pages.clear();
  e->page_start_hash.clear();
  e->len = 0;
  e->hash = kKvHashSeed;
  if (e->appending) e->append_cancelled = true;
  if (!had_kv) {  // only an append's reservation: nothing was ever published
    MaybeErase(e);
    return;
  }
  --stats_.users_held;
  using Cause = ResidencyEvent::Cause;
  Cause cause = Cause::kUnspecified;
  switch (reason) {
    case EvictReason::kLru:
      ++stats_.evictions_lru;
      cause = Cause::kLru;
      break;
    case EvictReason::kMismatch:
      ++stats_.evictions_mismatch;
      cause = Cause::kMismatch;
      break;
    case EvictReason::kReclaim:
      ++stats_.evictions_reclaim;
      cause = Cause::kAlpha;
      break;
    case EvictReason::kExplicit:
      ++stats_.evictions_explicit;
      cause = Cause::kExplicit;
      break;
  }
  Publish(ResidencyEvent::Kind::kKvEvicted, e->user, 0, cause);
  MaybeErase(e);
}

void KvCache::ReleasePin(Entry* e) {
  if (--e->pins > 0) return;
  --stats_.pinned_users;
  for (PageId p : e->retired) pool_.FreePage(p);
  stats_.pages_held -= e->retired.size();
  e->retired.clear();
  Touch(e);
  MaybeErase(e);
}

KvCache::Entry* KvCache::FindAppend(uint64_t user, const KvPrefix& appended) const {
  Entry* e = Find(user);
  return e != nullptr && e->appending && e->append_prefix == appended ? e : nullptr;
}

KvLookupResult KvCache::Lookup(uint64_t user, std::span<const uint64_t> history) {
  // The history's hash at every page boundary, computed before taking the lock; under it only the
  // tokens of the cached prefix's last partial page are hashed.
  const uint32_t pt = layout_.page_tokens;
  std::vector<uint64_t> boundary;
  boundary.reserve(history.size() / pt + 1);
  uint64_t h = kKvHashSeed;
  boundary.push_back(h);
  for (size_t i = 0; i < history.size(); ++i) {
    h = KvHashExtend(h, history[i]);
    if ((i + 1) % pt == 0) boundary.push_back(h);
  }

  absl::MutexLock lock(&mu_);
  ++stats_.lookups;
  stats_.tokens_requested += history.size();
  Entry* e = Find(user);
  if (e == nullptr) return {};
  Touch(e);
  if (e->len == 0) return {};
  bool match = false;
  if (history.size() >= e->len) {
    const uint64_t whole = e->len / pt;
    uint64_t prefix_hash = boundary[whole];
    for (uint64_t j = whole * pt; j < e->len; ++j) {
      prefix_hash = KvHashExtend(prefix_hash, history[j]);
    }
    match = prefix_hash == e->hash;
  }
  if (!match) {
    DropKv(e, EvictReason::kMismatch, nullptr);
    return {.prefix = {}, .evicted_stale = true};
  }
  ++stats_.lookup_hits;
  stats_.tokens_reused += e->len;
  return {.prefix = {.len = e->len, .hash = e->hash},
          .evicted_stale = false,
          .pages = std::vector<PageId>(e->pages.begin(), e->pages.begin() + CeilDiv(e->len, pt))};
}

std::optional<KvLookupResult> KvCache::LookupPrefix(uint64_t user, const KvPrefix& expected,
                                                    uint64_t requested_tokens) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(user);
  if (e == nullptr || e->len != expected.len || e->hash != expected.hash) return std::nullopt;
  Touch(e);
  ++stats_.lookups;
  stats_.tokens_requested += requested_tokens;
  if (e->len > 0) ++stats_.lookup_hits;
  stats_.tokens_reused += e->len;
  return KvLookupResult{
      .prefix = expected,
      .evicted_stale = false,
      .pages = std::vector<PageId>(e->pages.begin(),
                                   e->pages.begin() + CeilDiv(e->len, layout_.page_tokens))};
}

void KvCache::Pin(uint64_t user) {
  absl::MutexLock lock(&mu_);
  auto& slot = users_[user];
  if (slot == nullptr) {
    slot = std::make_unique<Entry>();
    slot->user = user;
    slot->last_access = clock_.Now();
  }
  Entry* e = slot.get();
  if (e->pins++ == 0) {
    ++stats_.pinned_users;
    LruRemove(e);
  }
}

absl::Status KvCache::Unpin(uint64_t user) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(user);
  if (e == nullptr || e->pins == 0) {
    return absl::FailedPreconditionError(absl::StrCat("kv_cache: Unpin(", user, ") not pinned"));
  }
  if (e->pins == 1 && e->appending) {
    return absl::FailedPreconditionError(
        absl::StrCat("kv_cache: Unpin(", user, ") not pinned (only its append in flight is)"));
  }
  ReleasePin(e);
  return absl::OkStatus();
}

absl::StatusOr<KvAppendResult> KvCache::Append(uint64_t user, const KvPrefix& expected,
                                               std::span<const uint64_t> new_tokens) {
  // The CAS below guarantees the prefix is `expected`, so the hashes of the new page boundaries
  // can be computed before taking the lock.
  const uint32_t pt = layout_.page_tokens;
  std::vector<uint64_t> new_page_start_hash;
  uint64_t h = expected.hash;
  for (size_t i = 0; i < new_tokens.size(); ++i) {
    if ((expected.len + i) % pt == 0) new_page_start_hash.push_back(h);
    h = KvHashExtend(h, new_tokens[i]);
  }
  return AppendHashed(user, expected, {.len = expected.len + new_tokens.size(), .hash = h},
                      new_page_start_hash);
}

absl::StatusOr<KvAppendResult> KvCache::AppendHashed(
    uint64_t user, const KvPrefix& expected, const KvPrefix& target,
    std::span<const uint64_t> new_page_start_hash) {
  const uint32_t pt = layout_.page_tokens;
  const uint64_t n = new_page_start_hash.size();
  // Page boundaries in [expected.len, target.len): multiples of pt.
  const uint64_t boundaries =
      target.len >= expected.len ? (target.len + pt - 1) / pt - (expected.len + pt - 1) / pt : 0;
  if (target.len < expected.len || n != boundaries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache: Append(", user, ") from length ", expected.len, " to ", target.len, " with ", n,
        " page-start hashes; ", boundaries, " page boundaries lie between",
        target.len < expected.len ? " (the target is shorter)" : ""));
  }
  const uint64_t new_tokens = target.len - expected.len;

  absl::MutexLock lock(&mu_);
  Entry* e = Find(user);
  const KvPrefix current = e ? KvPrefix{.len = e->len, .hash = e->hash} : KvPrefix{};
  if (current != expected || (e != nullptr && e->appending)) {
    ++stats_.append_conflicts;
    return absl::FailedPreconditionError(absl::StrCat(
        "kv_cache: Append(", user, ") expected cached length ", expected.len, " but it is ",
        current.len,
        current.len == expected.len && current != expected ? " with another prefix" : "",
        e != nullptr && e->appending ? " and another append is in flight" : ""));
  }
  KvAppendResult result;
  result.prefix = target;
  if (new_tokens == 0) return result;

  // Free pool pages within the budget first, then whole LRU victims. Decide before evicting
  // anyone, so a failed append changes nothing.
  std::vector<PageId> fresh;
  fresh.reserve(n);
  const uint64_t room = budget_pages_ > stats_.pages_held ? budget_pages_ - stats_.pages_held : 0;
  while (fresh.size() < std::min(n, room)) {
    absl::StatusOr<PageId> page = pool_.AllocPage(PageOwner::kKv);
    if (!page.ok()) break;
    fresh.push_back(*page);
  }
  const uint64_t victim_pages = lru_pages_ - (e != nullptr && e->in_lru ? e->pages.size() : 0);
  if (n - fresh.size() > victim_pages) {
    for (PageId p : fresh) pool_.FreePage(p);
    ++stats_.append_exhausted;
    return absl::ResourceExhaustedError(
        absl::StrCat("kv_cache: Append(", user, ") needs ", n, " pages; ", fresh.size(),
                     " free within the budget and ", victim_pages, " held by unpinned users"));
  }
  std::vector<PageId> taken;
  while (fresh.size() < n) {
    Entry* victim = lru_head_ == e ? e->next : lru_head_;
    if (victim == nullptr) CheckFailed("kv_cache", "LRU page count disagrees with the LRU list");
    taken.clear();
    DropKv(victim, EvictReason::kLru, &taken);
    ++result.evicted_users;
    for (PageId p : taken) {
      // A victim's page goes straight to the appender, so no one else can grab it meanwhile.
      if (fresh.size() < n) {
        fresh.push_back(p);
      } else {
        pool_.FreePage(p);
      }
    }
  }

  if (e == nullptr) {
    auto& slot = users_[user];
    slot = std::make_unique<Entry>();
    slot->user = user;
    e = slot.get();
  }
  if (e->pins++ == 0) {
    ++stats_.pinned_users;
    LruRemove(e);
  }
  e->appending = true;
  e->append_cancelled = false;
  e->append_prefix = target;
  uint64_t pos = e->len;
  size_t next_page = 0;
  for (uint64_t i = 0; i < new_tokens;) {
    const uint32_t slot = static_cast<uint32_t>(pos % pt);
    if (slot == 0) {
      e->page_start_hash.push_back(new_page_start_hash[next_page]);
      e->pages.push_back(fresh[next_page++]);
    }
    const uint32_t run = static_cast<uint32_t>(std::min<uint64_t>(pt - slot, new_tokens - i));
    result.runs.push_back({.page = e->pages.back(), .first_slot = slot, .tokens = run});
    i += run;
    pos += run;
  }
  stats_.pages_held += n;
  e->last_access = clock_.Now();
  return result;
}

absl::Status KvCache::CommitAppend(uint64_t user, const KvPrefix& appended) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindAppend(user, appended);
  if (e == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("kv_cache: CommitAppend(", user, "): no such append in flight"));
  }
  e->appending = false;
  if (e->append_cancelled) {
    ++stats_.appends_aborted;
    ReleasePin(e);
    return absl::AbortedError(
        absl::StrCat("kv_cache: CommitAppend(", user, "): the user's KV was dropped meanwhile"));
  }
  if (e->len == 0) ++stats_.users_held;
  stats_.tokens_appended += appended.len - e->len;
  ++stats_.appends;
  e->len = appended.len;
  e->hash = appended.hash;
  Publish(ResidencyEvent::Kind::kKvStored, user, e->len);
  ReleasePin(e);
  return absl::OkStatus();
}

absl::Status KvCache::AbortAppend(uint64_t user, const KvPrefix& appended) {
  absl::MutexLock lock(&mu_);
  Entry* e = FindAppend(user, appended);
  if (e == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("kv_cache: AbortAppend(", user, "): no such append in flight"));
  }
  e->appending = false;
  if (!e->append_cancelled) {
    // Only the appender wrote into the reserved pages, and it is done with them.
    const size_t keep = CeilDiv(e->len, layout_.page_tokens);
    for (size_t i = keep; i < e->pages.size(); ++i) pool_.FreePage(e->pages[i]);
    stats_.pages_held -= e->pages.size() - keep;
    e->pages.resize(keep);
    e->page_start_hash.resize(keep);
  }
  ++stats_.appends_aborted;
  ReleasePin(e);
  return absl::OkStatus();
}

bool KvCache::Evict(uint64_t user) {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(user);
  if (e == nullptr || e->pages.empty()) return false;
  const bool had_kv = e->len > 0;
  DropKv(e, EvictReason::kExplicit, nullptr);
  return had_kv;
}

void KvCache::SetBudgetPages(uint32_t pages) {
  absl::MutexLock lock(&mu_);
  budget_pages_ = pages;
}

uint32_t KvCache::budget_pages() const {
  absl::MutexLock lock(&mu_);
  return budget_pages_;
}

std::vector<PageId> KvCache::Reclaim(uint32_t max_pages, uint32_t max_users) {
  std::vector<PageId> out;
  absl::MutexLock lock(&mu_);
  const absl::Time idle_before = clock_.Now() - options_.reclaim_min_idle;
  uint32_t users = 0;
  const uint32_t pt = layout_.page_tokens;
  while (out.size() < max_pages && users < max_users && lru_head_ != nullptr &&
         lru_head_->last_access <= idle_before) {
    Entry* v = lru_head_;
    ++users;
    const uint64_t want = max_pages - out.size();
    if (want >= v->pages.size()) {
      DropKv(v, EvictReason::kReclaim, &out);
      continue;
    }
    // Tail pages only: the remaining pages are full, so the prefix ends at a page boundary whose
    // hash was checkpointed when that page was allocated.
    const size_t keep = v->pages.size() - want;
    out.insert(out.end(), v->pages.begin() + keep, v->pages.end());
    v->pages.resize(keep);
    v->len = keep * pt;
    v->hash = v->page_start_hash[keep];
    v->page_start_hash.resize(keep);
    lru_pages_ -= want;
    stats_.pages_held -= want;
    ++stats_.truncations_reclaim;
    Publish(ResidencyEvent::Kind::kKvTruncated, v->user, v->len, ResidencyEvent::Cause::kAlpha);
  }
  stats_.pages_reclaimed += out.size();
  return out;
}

std::vector<PageId> KvCache::BlockTable(uint64_t user) const {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(user);
  return e == nullptr ? std::vector<PageId>{} : e->pages;
}

uint64_t KvCache::cached_len(uint64_t user) const {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(user);
  return e == nullptr ? 0 : e->len;
}

std::optional<KvUserInfo> KvCache::Info(uint64_t user) const {
  absl::MutexLock lock(&mu_);
  Entry* e = Find(user);
  if (e == nullptr) return std::nullopt;
  return KvUserInfo{.prefix = {.len = e->len, .hash = e->hash},
                    .pages = static_cast<uint32_t>(e->pages.size()),
                    .retired_pages = static_cast<uint32_t>(e->retired.size()),
                    .pins = e->pins,
                    .append_in_flight = e->appending,
                    .last_access = e->last_access};
}

KvCacheStats KvCache::Stats() const {
  absl::MutexLock lock(&mu_);
  KvCacheStats stats = stats_;
  stats.budget_pages = budget_pages_;
  return stats;
}

absl::Status KvCache::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  const uint32_t pt = layout_.page_tokens;
  absl::flat_hash_map<PageId, uint64_t> page_user;
  uint64_t pages = 0, users_held = 0, pinned = 0, lru_expected = 0;
  auto fail = [](uint64_t user, auto&&... what) {
    return absl::InternalError(absl::StrCat("kv_cache user ", user, ": ", what...));
  };
  for (const auto& [user, e] : users_) {
    if (e->user != user) return fail(user, "entry names user ", e->user);
    const uint64_t tokens =
        e->appending ? (e->append_cancelled ? 0 : e->append_prefix.len) : e->len;
    if (e->pages.size() != CeilDiv(tokens, pt)) {
      return fail(user, e->pages.size(), " pages for ", tokens, " tokens");
    }
    if (e->appending && e->pins == 0) return fail(user, "append in flight without its pin");
    if (e->append_cancelled && e->len != 0) return fail(user, "cancelled append kept the KV");
    if (e->page_start_hash.size() != e->pages.size()) return fail(user, "hash checkpoints");
    if (!e->pages.empty() && e->page_start_hash[0] != kKvHashSeed) return fail(user, "seed");
    if (e->len == 0 && e->hash != kKvHashSeed) return fail(user, "empty prefix with a hash");
    if (e->pins == 0 && !e->retired.empty()) return fail(user, "retired pages while unpinned");
    if (e->pins == 0 && e->pages.empty()) return fail(user, "empty unpinned entry kept");
    if (e->in_lru != (e->pins == 0 && !e->pages.empty())) return fail(user, "LRU membership");
    if (e->in_lru) lru_expected += e->pages.size();
    for (const auto* list : {&e->pages, &e->retired}) {
      for (PageId p : *list) {
        if (!page_user.emplace(p, user).second) {
          return fail(user, "page ", p, " also held by user ", page_user[p]);
        }
        if (pool_.owner(p) != PageOwner::kKv) {
          return fail(user, "page ", p, " is ", PageOwnerName(pool_.owner(p)), " in the pool");
        }
      }
    }
    pages += e->pages.size() + e->retired.size();
    users_held += e->len > 0;
    pinned += e->pins > 0;
  }
  uint64_t lru_count = 0, lru_pages = 0;
  for (const Entry* e = lru_head_; e != nullptr; e = e->next) {
    if (++lru_count > users_.size()) return absl::InternalError("kv_cache: LRU list has a cycle");
    if (!e->in_lru || Find(e->user) != e) return fail(e->user, "stray LRU node");
    if (e->next == nullptr ? lru_tail_ != e : e->next->prev != e) return fail(e->user, "LRU links");
    lru_pages += e->pages.size();
  }
  if (lru_pages != lru_expected || lru_pages != lru_pages_) {
    return absl::InternalError(absl::StrCat("kv_cache: LRU pages ", lru_pages_,
                                            " but the list has ", lru_pages, " and entries ",
                                            lru_expected));
  }
  if (pages != stats_.pages_held || users_held != stats_.users_held ||
      pinned != stats_.pinned_users) {
    return absl::InternalError(absl::StrCat(
        "kv_cache: counted pages/users/pinned ", pages, "/", users_held, "/", pinned,
        " but stats say ", stats_.pages_held, "/", stats_.users_held, "/", stats_.pinned_users));
  }
  return absl::OkStatus();
}

}  // namespace hlem::serving
