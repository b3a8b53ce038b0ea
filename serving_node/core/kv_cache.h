#pragma once
// The KV side of the serving node's HBM pool (ARCHITECTURE §4): vLLM-style paged K/V per user.
//
// A page holds `page_tokens` tokens of K and V for every layer, laid out
// [layer][k|v][token][kv_dim] with kv_dim = heads·head_dim elements of `dtype_bytes` each; the
// tail of a page that does not fit a whole token stays unused. Per user the cache keeps a block
// table (the user's pages in token order), the cached token count, a 64-bit rolling hash of the
// cached tokens (KvHashExtend below) with a checkpoint at every page boundary, the last access
// time and a pin count.
//
// Protocol of one request (ARCHITECTURE §2): Pin(user); Lookup(user, history) gives the reusable
// prefix (a prefix whose hash does not match the history is evicted, never served); the model
// reads K/V of [0, C) through BlockTable(); Append(user, lookup.prefix, history[C:]) reserves the
// slots of the new tokens as a compare-and-set on the prefix (length and hash), so of two
// concurrent requests of one user at most one appends; the caller writes the new tokens' K/V
// into those slots and then calls CommitAppend, which makes them visible to Lookup (or
// AbortAppend); Unpin(user). Append is two-phase so that no request ever reads K/V slots that
// are still being written.
//
// Eviction: least-recently-used unpinned users, as whole users, when an Append needs pages and the
// KV side is at its budget or the pool is empty. Reclaim (for the EMB side when α grows) takes
// whole users or tail pages from LRU unpinned users, so every remaining prefix stays valid. A
// pinned user is never evicted, truncated or reclaimed by anyone else. When the KV of a pinned
// user is dropped (hash mismatch or Evict), its pages are retired, not freed: they stay owned by
// the cache until the last Unpin, so a concurrent request of the same user still reading them
// never sees them reused.
//
// Ownership: the cache owns the pages in its block tables (and retired pages); they are kKv in the
// pool. The HbmPool, the ResidencyEventLog and the Clock are borrowed and must outlive the cache.
// Pages returned by Reclaim belong to the caller (still kKv in the pool).
//
// Thread-safe: one mutex; each call holds it for O(pages touched + victims); hashing the request's
// tokens (Lookup, Append) runs outside it. Residency events are published under that mutex so
// their order matches the order of the changes; event-log subscribers must not call back into the
// KvCache. Lock order: KvCache → HbmPool, KvCache → ResidencyEventLog, KvCache → Clock.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rng.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_geometry.h"
#include "serving_node/core/residency_events.h"

namespace hlem::serving {

// Rolling hash of a token sequence: h_0 = kKvHashSeed, h_n = Mix64(h_{n-1} ^ token_n). The hash of
// a prefix extends token by token, so the cache can check a history against its cached prefix and
// keep the hash of every page-aligned shorter prefix. Tokens are caller-defined 64-bit values
// (e.g. a hash of the event's features).
inline constexpr uint64_t kKvHashSeed = 0x6b76636163686531ULL;  // "kvcache1"
constexpr uint64_t KvHashExtend(uint64_t hash, uint64_t token) { return Mix64(hash ^ token); }
uint64_t KvHash(std::span<const uint64_t> tokens, uint64_t hash = kKvHashSeed);

struct KvCacheOptions {
  uint32_t layers = 0;
  uint32_t kv_dim = 0;       // heads · head_dim (elements per token per layer, for K and for V)
  uint32_t dtype_bytes = 2;  // 2 = fp16/bf16, 4 = fp32
  // The most pages the KV side may hold at start; SetBudgetPages moves it. Default: whole pool.
  uint32_t budget_pages = UINT32_MAX;
  // Reclaim only takes users not accessed for at least this long (0: any unpinned user).
  absl::Duration reclaim_min_idle = absl::ZeroDuration();
};

// Where a token's K and V live inside a page (kv_geometry.h), made from validated options.
struct KvPageLayout : KvGeometry {
  // INVALID_ARGUMENT when a dimension is 0, dtype_bytes is not 1, 2, 4 or 8, or a page cannot
  // hold one token.
  static absl::StatusOr<KvPageLayout> Make(const KvCacheOptions& options, uint64_t page_bytes);
};

// A cached prefix: its length in tokens and its rolling hash. The empty prefix is {0, seed}.
struct KvPrefix {
  uint64_t len = 0;
  uint64_t hash = kKvHashSeed;
  bool operator==(const KvPrefix&) const = default;
};

struct KvLookupResult {
  KvPrefix prefix;             // the reusable prefix of the history (len 0 on a miss)
  bool evicted_stale = false;  // the cache held a prefix the history did not match; it was dropped
  // The pages of the prefix (token j in pages[j / page_tokens]), taken with the prefix so a
  // concurrent request of the same user cannot swap them in between. While the caller holds its
  // pin they are never freed or rewritten, even if that other request drops the user's KV.
  std::vector<PageId> pages;
};

// `tokens` consecutive token slots of one page, starting at slot `first_slot`.
struct KvSlotRun {
  PageId page = kNoPage;
  uint32_t first_slot = 0;
  uint32_t tokens = 0;
  bool operator==(const KvSlotRun&) const = default;
};

// The per-token targets of Device::ScatterKv for runs of a pool of `page_bytes` pages: token j
// of the runs (in order) goes to slot (*slots)[j] of the page at pool offset (*page_offsets)[j].
void KvScatterTargets(std::span<const KvSlotRun> runs, uint64_t page_bytes,
                      std::vector<uint64_t>* page_offsets, std::vector<uint32_t>* slots);

struct KvAppendResult {
  KvPrefix prefix;              // expected + new tokens: pass it to CommitAppend / AbortAppend
  std::vector<KvSlotRun> runs;  // where new_tokens[0..] go, in order; sum of tokens = new tokens
  uint32_t evicted_users = 0;   // LRU victims evicted to make room
};

struct KvUserInfo {
  KvPrefix prefix;
  uint32_t pages = 0;          // pages in the block table
  uint32_t retired_pages = 0;  // dropped while pinned, freed at the last Unpin
  uint32_t pins = 0;           // including the pin of an append in flight
  bool append_in_flight = false;
  absl::Time last_access;
};

// Cumulative counters (the node turns them into windows) and current gauges.
struct KvCacheStats {
  uint64_t lookups = 0;
  uint64_t lookup_hits = 0;       // lookups that reused at least one token (user-level hit)
  uint64_t tokens_requested = 0;  // history tokens presented to Lookup
  uint64_t tokens_reused = 0;     // cached tokens Lookup returned (token-weighted hit)
  uint64_t appends = 0;           // committed appends
  uint64_t tokens_appended = 0;
  uint64_t appends_aborted = 0;   // AbortAppend, or CommitAppend after the KV was dropped
  uint64_t append_conflicts = 0;  // FAILED_PRECONDITION: the prefix changed or append in flight
  uint64_t append_exhausted = 0;  // RESOURCE_EXHAUSTED: no room even after evicting
  uint64_t evictions_lru = 0;
  uint64_t evictions_mismatch = 0;
  uint64_t evictions_reclaim = 0;  // users reclaimed whole
  uint64_t evictions_explicit = 0;
  uint64_t truncations_reclaim = 0;  // users that lost tail pages to Reclaim
  uint64_t pages_reclaimed = 0;
  // Gauges.
  uint64_t pages_held = 0;  // block tables + retired pages (= pool's kKv pages minus Reclaim's)
  uint64_t users_held = 0;  // users with at least one cached token
  uint64_t pinned_users = 0;
  uint64_t budget_pages = 0;
};

class KvCache {
 public:
  // INVALID_ARGUMENT for a bad layout (see KvPageLayout::Make). `events` may be null.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options,
                                                         HbmPool& pool, ResidencyEventLog* events,
                                                         Clock& clock);
  // Frees every page the cache holds back to the pool.
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvPageLayout& layout() const { return layout_; }
  uint32_t page_tokens() const { return layout_.page_tokens; }
  // Byte offset inside the pool of the K or V vector of token slot `slot` of `page` in `layer`.
  uint64_t ByteOffset(PageId page, uint32_t layer, KvPart part, uint32_t slot) const {
    return pool_.PageOffset(page) + layout_.OffsetInPage(layer, part, slot);
  }

  // The longest cached prefix of `history` for `user`: C = the cached length when the history
  // has at least C tokens and the hash of history[0:C] equals the cached hash; otherwise the
  // user's KV is evicted (kKvEvicted) and C = 0. Updates the user's last access. Never fails.
  KvLookupResult Lookup(uint64_t user, std::span<const uint64_t> history);
  // Delta mode (the caller has only the tokens after a prefix it names): the user's cached prefix
  // when it is exactly `expected` (length and hash), counted as a lookup of `requested_tokens`
  // history tokens; nullopt otherwise (nothing is evicted or counted). Updates the last access.
  std::optional<KvLookupResult> LookupPrefix(uint64_t user, const KvPrefix& expected,
                                             uint64_t requested_tokens);

  // Marks the user's KV as just used (the most-recently-used end of the LRU), e.g. when a request
  // of the user is admitted, so the requests queued before it do not evict it; false when the user
  // has no KV.
  bool Touch(uint64_t user);

  // Pin count: a pinned user is never evicted, truncated or reclaimed by another operation.
  // Pinning a user without an entry creates an empty one. Unpin: FAILED_PRECONDITION when the user
  // is not pinned. The last Unpin frees retired pages and puts the user at the MRU end of the LRU.
  void Pin(uint64_t user);
  absl::Status Unpin(uint64_t user);

  // Reserves the slots of `new_tokens` after the cached prefix, as compare-and-set:
  // FAILED_PRECONDITION when the user's cached prefix (length and hash) is not `expected` or
  // another append of the user is in flight (nothing changes). Takes pages from the pool within
  // the budget, then from LRU unpinned users (never `user`, never pinned users), evicted whole
  // (kKvEvicted each). RESOURCE_EXHAUSTED when even that cannot make room: nothing changes, no
  // user is evicted. On success returns the slots the caller must fill with the new tokens' K/V
  // and holds a pin on the user until CommitAppend or AbortAppend, one of which the caller must
  // call; until then Lookup still returns the old prefix. An empty `new_tokens` only checks the
  // prefix and reserves nothing.
  absl::StatusOr<KvAppendResult> Append(uint64_t user, const KvPrefix& expected,
                                        std::span<const uint64_t> new_tokens);
  // The same, for a caller that has the new tokens' hashes already (the simulator's placeholder
  // histories): `target` is the prefix after them and page_start_hash the prefix hashes at the
  // page boundaries they cross (positions expected.len … target.len − 1 that are multiples of
  // page_tokens), in order. INVALID_ARGUMENT when target is shorter than expected or the count
  // of page_start_hash does not match (nothing changes).
  absl::StatusOr<KvAppendResult> AppendHashed(uint64_t user, const KvPrefix& expected,
                                              const KvPrefix& target,
                                              std::span<const uint64_t> page_start_hash);
  // Makes an append visible (its K/V bytes are written): the cached prefix becomes
  // `appended` (= the result's prefix) and kKvStored is published. FAILED_PRECONDITION when no
  // such append is in flight; ABORTED when the user's KV was dropped meanwhile (hash mismatch or
  // Evict): nothing is stored. Either way the append's pin is released.
  absl::Status CommitAppend(uint64_t user, const KvPrefix& appended);
  // Gives up an append in flight: its new pages return to the pool, the prefix stays as it was,
  // the append's pin is released. FAILED_PRECONDITION when no such append is in flight.
  absl::Status AbortAppend(uint64_t user, const KvPrefix& appended);

  // Drops the user's KV (kKvEvicted); false when it had none. A pinned user keeps its entry (and
  // pins) with its pages retired until the last Unpin. An append in flight is cancelled (its
  // CommitAppend will say ABORTED).
  bool Evict(uint64_t user);

  // Budget in pages. Lowering it evicts nothing by itself: appends stop growing the KV side and
  // take pages from LRU users instead, and Reclaim hands pages to the EMB side.
  void SetBudgetPages(uint32_t pages);
  uint32_t budget_pages() const;

  // Takes up to `max_pages` pages from at most `max_users` LRU unpinned users idle for at least
  // options.reclaim_min_idle, coldest first: whole users (kKvEvicted) or, for the last user
  // touched, tail pages (kKvTruncated with the tokens left; the cached length shrinks to whole
  // pages and its hash to that page boundary's checkpoint). The returned pages leave the cache
  // but stay kKv in the pool: the caller owns them and must Transfer them to kEmb or FreePage them.
  std::vector<PageId> Reclaim(uint32_t max_pages, uint32_t max_users);

  // The user's pages in token order (empty when none): token j is in page [j / page_tokens],
  // slot j % page_tokens; includes the pages of an append in flight. A request reading its prefix
  // uses KvLookupResult::pages instead: this table may change under it.
  std::vector<PageId> BlockTable(uint64_t user) const;
  uint64_t cached_len(uint64_t user) const;
  std::optional<KvUserInfo> Info(uint64_t user) const;
  KvCacheStats Stats() const;

  // Internal consistency (block tables, hash checkpoints, LRU, page counts, pool ownership).
  // INTERNAL with the first violation. O(users + pages); for tests.
  absl::Status CheckInvariants() const;

 private:
  struct Entry;
  enum class EvictReason { kLru, kMismatch, kReclaim, kExplicit };

  KvCache(const KvCacheOptions& options, const KvPageLayout& layout, HbmPool& pool,
          ResidencyEventLog* events, Clock& clock);

  void LruRemove(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruPushBack(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops e's KV: frees its pages (or retires them when pinned), cancels an append in flight,
  // publishes kKvEvicted, erases the entry when unpinned. `keep_pages`, when set, receives the
  // pages instead of the pool.
  void DropKv(Entry* e, EvictReason reason, std::vector<PageId>* keep_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleasePin(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The append in flight of `user` that reserved `appended`, or null.
  Entry* FindAppend(uint64_t user, const KvPrefix& appended) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void MaybeErase(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish(ResidencyEvent::Kind kind, uint64_t user, uint64_t tokens,
               ResidencyEvent::Cause cause = ResidencyEvent::Cause::kUnspecified)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* Find(uint64_t user) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const KvCacheOptions options_;
  const KvPageLayout layout_;
  HbmPool& pool_;
  ResidencyEventLog* const events_;
  Clock& clock_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Entry>> users_ ABSL_GUARDED_BY(mu_);
  // Unpinned users holding pages, least recently used first (intrusive, O(1) per access).
  Entry* lru_head_ ABSL_GUARDED_BY(mu_) = nullptr;
  Entry* lru_tail_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t lru_pages_ ABSL_GUARDED_BY(mu_) = 0;  // pages of the users on the LRU list
  uint32_t budget_pages_ ABSL_GUARDED_BY(mu_);
  KvCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hlem::serving
