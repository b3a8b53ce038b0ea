#pragma once
// EmbCache's per-class and per-page bookkeeping, shared by the .cc files that implement the cache
// (emb_cache.cc, emb_cache_admission.cc, emb_cache_check.cc). Not part of the API.

#include <cstdint>
#include <memory>
#include <vector>

#include "serving_node/core/emb_cache.h"

namespace hlem::serving {

inline constexpr uint32_t kNotOpen = UINT32_MAX;

struct EmbCache::SizeClass {
  uint32_t row_bytes = 0;
  uint32_t slots_per_page = 0;
  uint32_t pages = 0;
  std::vector<PageId> open;  // held pages with never-used slots or holes
  std::unique_ptr<EmbReplacementPolicy> policy;
};

struct EmbCache::PageMeta {
  int32_t cls = -1;   // size class holding the page; -1 when the cache does not hold it
  uint32_t used = 0;  // slots handed out so far: [0, used) hold live entries or holes
  uint32_t live = 0;  // live entries, pending ones included
  uint32_t pending = 0;
  uint32_t pinned = 0;  // entries with pins > 0: the page is not given back while any is
  uint32_t held_pos = 0;
  uint32_t open_pos = kNotOpen;
  uint32_t heat = 0;  // accesses, halved every heat epoch (applied lazily)
  uint32_t heat_epoch = 0;
  uint64_t last_access = 0;
  std::vector<uint32_t> holes;  // slots below `used` freed by Abort, taken first
  ShardCounts shards;           // committed entries per (table, residency shard)
};

}  // namespace hlem::serving
