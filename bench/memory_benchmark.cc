// Costs of the serving node's memory system (issue 3), metadata and host bytes only.
//
//   emb_hit/<rows>/<variant>  Batches of 1024 Zipf(1.0) rows that all hit. lru and tinylfu:
//       EmbCache::Lookup, then a gather of every hit slot out of the CpuDevice arena into one
//       contiguous buffer. flat_gather: the same rows memcpy'd out of one flat array of the same
//       size (the limit). index_floor: a one-line-probe read-only hash table (row -> offset) in
//       front of the same gather: what any index that must be probed per row costs at least.
//       <policy>_lookup_only: the Lookup alone; <policy>_pinned: the node's Lookup with pin and
//       the Unpin after (the pipeline pins a request's hits until they are summed).
//       Tables of 1 GiB (4 Mi rows of 256 B, 512 Ki rows of 2 KiB) in a pool of
//       2 MiB pages that holds them all.
//   emb_shrink/<policy>  EmbCache::Shrink of 10 % of an 80 GB pool of 2 MiB pages (4096 of 40 960
//       pages; the HbmPool has no bytes) whose pages are all full of 16 KiB rows; manual time of
//       the Shrink call. Then the deferred residency-count work it leaves: query_us, one
//       ResidentRows right after (exact, one probe per shrunk page); drain_calls and
//       drain_max_ms, the EmbCache::DrainPending(4096) calls that subtract the rest (the
//       MemoryManager makes 8 per Step) and the longest of them (a lookup's longest wait).
//   kv_reclaim  KvCache::Reclaim of 4096 pages from 10 000 users holding all 40 960 pages.
//   kv/<op>  Per-request KvCache costs for a local-profile-like model (2 layers, kv_dim 128, fp32,
//       64 KiB pages of 32 tokens), 1000 users with histories of 256..2048 tokens: lookup (a
//       returning user's history), append16 (Append + CommitAppend of 16 tokens), request (Pin,
//       Lookup, Append, CommitAppend, Unpin).
//   popularity/record_batch  PopularitySketch::RecordBatch as the node runs it (65 536 counters,
//       every access counted) on batches of 1024 Zipf(1.0) rows of 16 Mi, the summary full and
//       decayed by a first pass over the ids; rows per second. The node records every row a
//       request looks up (a cold 15 000-event request: 30 000).
// The caches run on a SimClock. At the end a summary with the targets is printed;
// docs/perf/memory.md records a run.
//
// Own flag (everything else goes to Google Benchmark): --smoke, tiny sizes (the CTest smoke pass).
// Defaults, overridable on the command line: --benchmark_min_time=0.3 --benchmark_repetitions=3
// --benchmark_display_aggregates_only=true (the summary uses medians).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "common/clock.h"
#include "common/huge_pages.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/popularity.h"
#include "serving_node/device/cpu_device.h"
#include "serving_node/device/gather_scatter.h"

namespace hlem::bench {
namespace {

using serving::CpuDevice;
using serving::EmbCache;
using serving::EmbPolicy;
using serving::HbmPool;
using serving::KvCache;
using serving::KvPrefix;
using serving::PageId;

constexpr uint64_t kSeed = 1;
constexpr double kZipfExponent = 1.0;
constexpr uint32_t kBatch = 1024;
constexpr uint32_t kTable = 1;
constexpr uint64_t kPageBytes = uint64_t{2} << 20;
constexpr uint32_t kMoveRowBytes = 16 << 10;  // 128 rows per page
constexpr uint64_t kMoveTableRows = uint64_t{1} << 27;
constexpr uint32_t kNewTokens = 16;
constexpr uint32_t kGrowth = 1024;  // tokens a user may grow by before its KV is rebuilt
constexpr double kTargetHitRatio = 0.5;
constexpr double kTargetNsPerPage = 1000;
constexpr double kTargetChangeSeconds = 5e-3;

struct Sizes {
  uint64_t hit_pool_bytes = uint64_t{1} << 30;
  size_t zipf_ids = size_t{1} << 20;  // ids every emb_hit case cycles through
  uint32_t move_pages = 40960;
  uint32_t reclaim_users = 10000;
  uint32_t kv_users = 1000;
  int move_iterations = 8;
};

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Row bytes: the row id, then a byte derived from it; RowIs checks both ends.
void WriteRow(std::byte* dst, uint64_t row, uint32_t row_bytes) {
  std::memset(dst, static_cast<int>(Mix64(row) & 0xff), row_bytes);
  std::memcpy(dst, &row, sizeof(row));
}
bool RowIs(const std::byte* src, uint64_t row, uint32_t row_bytes) {
  uint64_t head;
  std::memcpy(&head, src, sizeof(head));
  return head == row && src[row_bytes - 1] == static_cast<std::byte>(Mix64(row) & 0xff);
}

// ---------------------------------------------------------------------------------------------
// EMB hit path.

// One EmbCache over its own pool, whose bytes are the arena of a CpuDevice.
struct CachedTable {
  SimClock clock;
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<HbmPool> pool;
  std::unique_ptr<EmbCache> cache;
};

// Everything the emb_hit cases of one row size read. Built on first use and dropped when the
// other row size is needed, so at most one world (about 3 GiB of arenas) is alive.
struct HitWorld {
  uint32_t row_bytes = 0;
  uint64_t rows = 0;
  std::vector<uint64_t> ids;
  HugePageBuffer flat;                     // huge pages, as the cpu device's arena
  std::unique_ptr<CachedTable> cached[2];  // by EmbPolicy
  // index_floor: a read-only linear-probing table row -> byte offset in `flat`, 16-byte slots at
  // load 1/2, so a probe is one (prefetched) cache line: the cheapest index a cache could have,
  // with no recency, no page heat, no staleness check.
  struct FloorSlot {
    uint64_t row = UINT64_MAX;
    uint64_t offset = 0;
  };
  std::vector<FloorSlot, HugePageAllocator<FloorSlot>> floor;
  uint64_t FloorHome(uint64_t row) const { return Mix64(row) & (floor.size() - 1); }
};

std::span<const uint64_t> NextBatch(const std::vector<uint64_t>& ids, size_t* cursor) {
  if (*cursor + kBatch > ids.size()) *cursor = 0;
  std::span<const uint64_t> batch(ids.data() + *cursor, kBatch);
  *cursor += kBatch;
  return batch;
}

// Looks up one batch and gathers the hits with the gather the cpu device runs
// (serving::GatherRowsHost, prefetching rows ahead); false unless every row hit.
bool CachedGather(CachedTable& t, uint32_t row_bytes, std::span<const uint64_t> batch,
                  serving::EmbLookupResult* result, std::byte* out) {
  if (!t.cache->Lookup(kTable, batch, result).ok() || result->hits != batch.size()) return false;
  serving::GatherRowsHost(t.device->pool_data(), result->offsets.data(), result->offsets.size(),
                          row_bytes, out);
  return true;
}

absl::StatusOr<std::unique_ptr<CachedTable>> BuildCachedTable(const Sizes& sz, uint32_t row_bytes,
                                                              uint64_t rows, EmbPolicy policy) {
  auto t = std::make_unique<CachedTable>();
  auto device = CpuDevice::Create({.pool_bytes = sz.hit_pool_bytes}, t->clock);
  if (!device.ok()) return device.status();
  t->device = std::move(*device);
  auto pool = HbmPool::Create({.pool_bytes = sz.hit_pool_bytes, .page_bytes = kPageBytes});
  if (!pool.ok()) return pool.status();
  t->pool = std::move(*pool);
  serving::EmbCacheOptions options;
  options.tables = {{.table_id = kTable, .row_bytes = row_bytes}};
  options.policy = policy;
  options.budget_pages = t->pool->num_pages();
  auto cache = EmbCache::Create(options, *t->pool, t->clock);
  if (!cache.ok()) return cache.status();
  t->cache = std::move(*cache);
  std::vector<uint64_t> chunk, offsets;
  for (uint64_t first = 0; first < rows; first += 65536) {
    chunk.clear();
    for (uint64_t r = first; r < std::min(rows, first + 65536); ++r) chunk.push_back(r);
    offsets.clear();
    absl::Status s = t->cache->InsertBatch(kTable, chunk, &offsets);
    if (!s.ok()) return s;
    for (size_t i = 0; i < chunk.size(); ++i) {
      WriteRow(t->device->pool_data() + offsets[i], chunk[i], row_bytes);
    }
  }
  serving::EmbCacheStats stats = t->cache->GetStats();
  if (stats.entries != rows || stats.evictions != 0) {
    return absl::InternalError(absl::StrCat(serving::EmbPolicyName(policy), ": ", stats.entries,
                                            " entries and ", stats.evictions,
                                            " evictions after inserting ", rows, " rows"));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<HitWorld>> BuildHitWorld(const Sizes& sz, uint32_t row_bytes) {
  auto w = std::make_unique<HitWorld>();
  w->row_bytes = row_bytes;
  w->rows = sz.hit_pool_bytes / row_bytes;
  Rng rng(kSeed);
  ZipfSampler zipf(w->rows, kZipfExponent);
  w->ids.resize(sz.zipf_ids);
  // Zipf ranks are scattered over the table by a hash of the rank (as shard_fetch_benchmark does).
  for (uint64_t& id : w->ids) id = Mix64(zipf(rng) ^ kSeed) % w->rows;
  w->flat = MakeHugePageBuffer(w->rows * row_bytes);
  for (uint64_t r = 0; r < w->rows; ++r) WriteRow(w->flat.get() + r * row_bytes, r, row_bytes);
  w->floor.resize(std::bit_ceil(2 * w->rows));
  for (uint64_t r = 0; r < w->rows; ++r) {
    uint64_t h = w->FloorHome(r);
    while (w->floor[h].row != UINT64_MAX) h = (h + 1) & (w->floor.size() - 1);
    w->floor[h] = {r, r * row_bytes};
  }
  std::vector<std::byte> out(size_t{kBatch} * row_bytes);
  serving::EmbLookupResult result;
  for (EmbPolicy policy : {EmbPolicy::kLru, EmbPolicy::kTinyLfu}) {
    auto t = BuildCachedTable(sz, row_bytes, w->rows, policy);
    if (!t.ok()) return t.status();
    // One pass over every id (checking the bytes of the first batches) before anything is timed.
    size_t cursor = 0;
    for (size_t b = 0; b < w->ids.size() / kBatch; ++b) {
      std::span<const uint64_t> batch = NextBatch(w->ids, &cursor);
      if (!CachedGather(**t, row_bytes, batch, &result, out.data())) {
        return absl::InternalError(absl::StrCat(serving::EmbPolicyName(policy), ": only ",
                                                result.hits, " of ", kBatch, " rows hit"));
      }
      for (size_t i = 0; b < 16 && i < batch.size(); ++i) {
        if (!RowIs(out.data() + i * row_bytes, batch[i], row_bytes)) {
          return absl::DataLossError(absl::StrCat(serving::EmbPolicyName(policy), ": row ",
                                                  batch[i], " gathered wrong bytes"));
        }
      }
    }
    w->cached[static_cast<int>(policy)] = std::move(*t);
  }
  return w;
}

std::unique_ptr<HitWorld>& HitWorldSlot() {
  static std::unique_ptr<HitWorld> world;
  return world;
}

HitWorld* GetHitWorld(const Sizes& sz, uint32_t row_bytes, std::string* error) {
  std::unique_ptr<HitWorld>& world = HitWorldSlot();
  if (world != nullptr && world->row_bytes == row_bytes) return world.get();
  world.reset();  // before building the next one: one world at a time
  auto built = BuildHitWorld(sz, row_bytes);
  if (!built.ok()) {
    *error = built.status().ToString();
    return nullptr;
  }
  world = std::move(*built);
  return world.get();
}

// Rows/s, and bytes/s of the rows gathered (none for lookup_only).
void SetHitRates(benchmark::State& state, uint32_t row_bytes) {
  const int64_t rows = static_cast<int64_t>(state.iterations()) * kBatch;
  state.SetItemsProcessed(rows);
  if (row_bytes > 0) state.SetBytesProcessed(rows * row_bytes);
}

void EmbHitFlat(benchmark::State& state, const Sizes* sz, uint32_t row_bytes) {
  std::string error;
  HitWorld* w = GetHitWorld(*sz, row_bytes, &error);
  if (w == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  std::vector<std::byte> out(size_t{kBatch} * row_bytes);
  const std::byte* flat = w->flat.get();
  std::vector<uint64_t> offsets(kBatch);
  size_t cursor = 0;
  // The same gather routine as the cached cases, so the ratio prices the index alone.
  auto gather = [&] {
    std::span<const uint64_t> batch = NextBatch(w->ids, &cursor);
    for (size_t i = 0; i < batch.size(); ++i) offsets[i] = batch[i] * row_bytes;
    serving::GatherRowsHost(flat, offsets.data(), batch.size(), row_bytes, out.data());
  };
  for (int i = 0; i < 64; ++i) gather();  // this case's working set back into the caches
  for (auto _ : state) {
    gather();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetHitRates(state, row_bytes);
}

// index_floor: a one-line probe per row (prefetched 12 rows ahead), then the same gather.
void EmbHitFloor(benchmark::State& state, const Sizes* sz, uint32_t row_bytes) {
  std::string error;
  HitWorld* w = GetHitWorld(*sz, row_bytes, &error);
  if (w == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  std::vector<std::byte> out(size_t{kBatch} * row_bytes);
  const std::byte* flat = w->flat.get();
  const uint64_t mask = w->floor.size() - 1;
  std::vector<uint64_t> offsets;
  size_t cursor = 0;
  auto gather = [&] {
    std::span<const uint64_t> batch = NextBatch(w->ids, &cursor);
    std::byte* dst = out.data();
    offsets.resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      if (i + 12 < batch.size()) __builtin_prefetch(&w->floor[w->FloorHome(batch[i + 12])]);
      uint64_t h = w->FloorHome(batch[i]);
      while (w->floor[h].row != batch[i]) h = (h + 1) & mask;
      offsets[i] = w->floor[h].offset;
    }
    serving::GatherRowsHost(flat, offsets.data(), offsets.size(), row_bytes, dst);
  };
  for (int i = 0; i < 64; ++i) gather();
  for (auto _ : state) {
    gather();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetHitRates(state, row_bytes);
}

// lookup_only: EmbCache::Lookup without the gather, to split the index and policy cost from the
// byte copy.
void EmbHitCached(benchmark::State& state, const Sizes* sz, uint32_t row_bytes, EmbPolicy policy,
                  bool lookup_only, bool pinned) {
  std::string error;
  HitWorld* w = GetHitWorld(*sz, row_bytes, &error);
  if (w == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  CachedTable& t = *w->cached[static_cast<int>(policy)];
  std::vector<std::byte> out(size_t{kBatch} * row_bytes);
  serving::EmbLookupResult result;
  size_t cursor = 0;
  for (int i = 0; i < 64; ++i) {
    CachedGather(t, row_bytes, NextBatch(w->ids, &cursor), &result, out.data());
  }
  for (auto _ : state) {
    if (lookup_only) {
      const std::span<const uint64_t> batch = NextBatch(w->ids, &cursor);
      if (!t.cache->Lookup(kTable, batch, &result, pinned).ok() || result.hits != kBatch) {
        state.SkipWithError("a row of the batch missed");
        break;
      }
      benchmark::DoNotOptimize(result.offsets.data());
      if (pinned && !t.cache->Unpin(result.pinned).ok()) {
        state.SkipWithError("a hit was not pinned");
        break;
      }
      continue;
    }
    if (!CachedGather(t, row_bytes, NextBatch(w->ids, &cursor), &result, out.data())) {
      state.SkipWithError("a row of the batch missed");
      break;
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetHitRates(state, lookup_only ? 0 : row_bytes);
}

// ---------------------------------------------------------------------------------------------
// Moving pages between the sides: EmbCache::Shrink and KvCache::Reclaim, metadata only.

uint32_t MovePages(const Sizes& sz) { return sz.move_pages / 10; }

// Row i of the fill: a bijection of [0, 2^27) that scatters consecutive i over the table, so a
// page holds rows of many residency shards (as Zipf-driven admissions would).
uint64_t MoveRow(uint64_t i) { return (i * 0x9E3779B1ULL) & (kMoveTableRows - 1); }

struct ShrinkWorld {
  SimClock clock;
  std::unique_ptr<HbmPool> pool;
  std::unique_ptr<EmbCache> cache;
  std::vector<std::vector<uint64_t>> page_rows;  // by PageId: the rows whose slots are on it
};

// Admits `rows` and records which page each landed on.
absl::Status AdmitRows(ShrinkWorld& w, std::span<const uint64_t> rows) {
  std::vector<uint64_t> offsets;
  absl::Status s = w.cache->InsertBatch(kTable, rows, &offsets);
  if (!s.ok()) return s;
  for (size_t i = 0; i < rows.size(); ++i) w.page_rows[offsets[i] / kPageBytes].push_back(rows[i]);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShrinkWorld>> BuildShrinkWorld(const Sizes& sz, EmbPolicy policy) {
  auto w = std::make_unique<ShrinkWorld>();
  auto pool = HbmPool::Create({.pool_bytes = uint64_t{sz.move_pages} * kPageBytes});
  if (!pool.ok()) return pool.status();
  w->pool = std::move(*pool);
  serving::EmbCacheOptions options;
  options.tables = {{.table_id = kTable, .row_bytes = kMoveRowBytes}};
  options.policy = policy;
  options.budget_pages = w->pool->num_pages();
  auto cache = EmbCache::Create(options, *w->pool, w->clock);
  if (!cache.ok()) return cache.status();
  w->cache = std::move(*cache);
  w->page_rows.resize(w->pool->num_pages());
  const uint64_t entries = uint64_t{w->pool->num_pages()} * w->cache->SlotsPerPage(kMoveRowBytes);
  std::vector<uint64_t> chunk;
  for (uint64_t first = 0; first < entries; first += 65536) {
    chunk.clear();
    for (uint64_t i = first; i < std::min(entries, first + 65536); ++i) chunk.push_back(MoveRow(i));
    absl::Status s = AdmitRows(*w, chunk);
    if (!s.ok()) return s;
  }
  // Zipf lookups give the pages different heat, so Shrink has a real selection to make.
  Rng rng(kSeed);
  ZipfSampler zipf(entries, kZipfExponent);
  std::vector<uint64_t> batch(kBatch);
  serving::EmbLookupResult result;
  for (int b = 0; b < 256; ++b) {
    for (uint64_t& row : batch) row = MoveRow(Mix64(zipf(rng) ^ kSeed) % entries);
    absl::Status s = w->cache->Lookup(kTable, batch, &result);
    if (!s.ok()) return s;
  }
  serving::EmbCacheStats stats = w->cache->GetStats();
  if (stats.entries != entries || stats.pages_held != w->pool->num_pages()) {
    return absl::InternalError(absl::StrCat("shrink world: ", stats.entries, " entries on ",
                                            stats.pages_held, " pages after the fill"));
  }
  return w;
}

ShrinkWorld* GetShrinkWorld(const Sizes& sz, EmbPolicy policy, std::string* error) {
  static std::unique_ptr<ShrinkWorld> world;
  static EmbPolicy built_for;
  if (world != nullptr && built_for == policy) return world.get();
  world.reset();
  HitWorldSlot().reset();  // the emb_hit cases are done: their arenas are not needed any more
  auto built = BuildShrinkWorld(sz, policy);
  if (!built.ok()) {
    *error = built.status().ToString();
    return nullptr;
  }
  world = std::move(*built);
  built_for = policy;
  return world.get();
}

void EmbShrink(benchmark::State& state, const Sizes* sz, EmbPolicy policy, bool check) {
  std::string error;
  ShrinkWorld* w = GetShrinkWorld(*sz, policy, &error);
  if (w == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  const uint32_t move = MovePages(*sz);
  std::vector<PageId> freed;
  std::vector<uint64_t> rows;
  double shrink_s = 0, query_s = 0, drain_max_s = 0, drain_calls = 0, entries = 0;
  for (auto _ : state) {
    freed.clear();
    const uint64_t shrunk_before = w->cache->GetStats().shrunk_entries;
    auto t0 = std::chrono::steady_clock::now();
    uint32_t n = w->cache->Shrink(move, &freed);
    auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(w->cache->ResidentRows(kTable, 0));
    auto t2 = std::chrono::steady_clock::now();
    for (bool more = true; more;) {
      auto d0 = std::chrono::steady_clock::now();
      more = w->cache->DrainPending(4096);
      drain_max_s = std::max(drain_max_s, Seconds(std::chrono::steady_clock::now() - d0));
      ++drain_calls;
    }
    state.SetIterationTime(Seconds(t1 - t0));
    shrink_s += Seconds(t1 - t0);
    query_s += Seconds(t2 - t1);
    entries += w->cache->GetStats().shrunk_entries - shrunk_before;
    if (n != move || w->pool->free_pages() != move) {
      state.SkipWithError(absl::StrCat("Shrink gave back ", n, " of ", move, " pages").c_str());
      break;
    }
    // Untimed: the budget back and the same rows admitted again (meeting their stale entries),
    // so every iteration shrinks a full cache.
    rows.clear();
    for (PageId p : freed) {
      rows.insert(rows.end(), w->page_rows[p].begin(), w->page_rows[p].end());
      w->page_rows[p].clear();
    }
    w->cache->SetBudgetPages(w->pool->num_pages());
    absl::Status s = AdmitRows(*w, rows);
    if (s.ok() && w->pool->free_pages() != 0) s = absl::InternalError("refill left free pages");
    if (s.ok() && check) s = w->cache->CheckInvariants();
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
  }
  const double iterations = std::max<double>(1, static_cast<double>(state.iterations()));
  state.counters["pages"] = move;
  state.counters["entries"] = entries / iterations;
  state.counters["ns_per_page"] = shrink_s * 1e9 / (iterations * move);
  state.counters["query_us"] = query_s * 1e6 / iterations;
  state.counters["drain_calls"] = drain_calls / iterations;
  state.counters["drain_max_ms"] = drain_max_s * 1e3;
}

uint64_t ReclaimToken(uint64_t user, uint64_t j) { return KeyedHash(kSeed, user, j); }

struct ReclaimWorld {
  SimClock clock;
  std::unique_ptr<HbmPool> pool;
  std::unique_ptr<KvCache> kv;
  std::vector<uint64_t> target;  // per user: tokens it holds when full
};

// Appends the user's tokens from its cached length up to its target.
absl::Status FillUser(ReclaimWorld& w, uint64_t user) {
  std::optional<serving::KvUserInfo> info = w.kv->Info(user);
  KvPrefix prefix = info ? info->prefix : KvPrefix{};
  std::vector<uint64_t> tokens;
  for (uint64_t j = prefix.len; j < w.target[user]; ++j) tokens.push_back(ReclaimToken(user, j));
  if (tokens.empty()) return absl::OkStatus();
  auto r = w.kv->Append(user, prefix, tokens);
  if (!r.ok()) return r.status();
  return w.kv->CommitAppend(user, r->prefix);
}

absl::StatusOr<std::unique_ptr<ReclaimWorld>> BuildReclaimWorld(const Sizes& sz) {
  auto w = std::make_unique<ReclaimWorld>();
  auto pool = HbmPool::Create({.pool_bytes = uint64_t{sz.move_pages} * kPageBytes});
  if (!pool.ok()) return pool.status();
  w->pool = std::move(*pool);
  // 8 layers · K and V · 1024 · fp16 = 32 KiB per token: 64 tokens per 2 MiB page.
  auto kv =
      KvCache::Create({.layers = 8, .kv_dim = 1024, .dtype_bytes = 2}, *w->pool, nullptr, w->clock);
  if (!kv.ok()) return kv.status();
  w->kv = std::move(*kv);
  const uint32_t users = sz.reclaim_users, pages = w->pool->num_pages();
  for (uint32_t u = 0; u < users; ++u) {
    const uint32_t user_pages = pages / users + (u < pages % users ? 1 : 0);
    w->target.push_back(uint64_t{user_pages} * w->kv->page_tokens());
  }
  for (uint32_t u = 0; u < users; ++u) {
    absl::Status s = FillUser(*w, u);
    if (!s.ok()) return s;
  }
  if (w->pool->free_pages() != 0) return absl::InternalError("reclaim world: pool not full");
  return w;
}

void KvReclaim(benchmark::State& state, const Sizes* sz, bool check) {
  auto built = BuildReclaimWorld(*sz);
  if (!built.ok()) {
    state.SkipWithError(built.status().ToString().c_str());
    return;
  }
  ReclaimWorld& w = **built;
  const uint32_t move = MovePages(*sz);
  double reclaim_s = 0, users_hit = 0;
  for (auto _ : state) {
    const uint64_t evicted_before = w.kv->Stats().evictions_reclaim;
    auto t0 = std::chrono::steady_clock::now();
    std::vector<PageId> pages = w.kv->Reclaim(move, UINT32_MAX);
    auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(Seconds(t1 - t0));
    reclaim_s += Seconds(t1 - t0);
    users_hit += w.kv->Stats().evictions_reclaim - evicted_before;
    if (pages.size() != move) {
      state.SkipWithError(absl::StrCat("Reclaim gave ", pages.size(), " pages").c_str());
      break;
    }
    // Untimed: the pages back to the pool and the users that lost them refilled (they become the
    // most recently used, so the next Reclaim takes the next users in LRU order).
    for (PageId p : pages) w.pool->FreePage(p);
    absl::Status s;
    for (uint64_t u = 0; s.ok() && u < w.target.size(); ++u) {
      if (w.kv->cached_len(u) < w.target[u]) s = FillUser(w, u);
    }
    if (s.ok() && check) s = w.kv->CheckInvariants();
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
  }
  const double iterations = std::max<double>(1, static_cast<double>(state.iterations()));
  state.counters["pages"] = move;
  state.counters["users_evicted"] = users_hit / iterations;
  state.counters["ns_per_page"] = reclaim_s * 1e9 / (iterations * move);
}

// ---------------------------------------------------------------------------------------------
// KV per request, local-profile-like model.

struct RequestWorld {
  SimClock clock;
  std::unique_ptr<HbmPool> pool;
  std::unique_ptr<KvCache> kv;
  std::vector<std::vector<uint64_t>> history;  // per user: base + kGrowth + kNewTokens tokens
  std::vector<uint64_t> base;                  // per user: history length at start
  std::vector<KvPrefix> cached;                // per user: what the cache holds
  std::vector<uint32_t> sequence;              // users of successive requests
  size_t cursor = 0;

  uint32_t NextUser() {
    if (cursor == sequence.size()) cursor = 0;
    return sequence[cursor++];
  }
  // The user's KV rebuilt from its base history (a user that grew past base + kGrowth).
  absl::Status Reset(uint32_t u) {
    kv->Evict(u);
    auto r = kv->Append(u, KvPrefix{}, std::span(history[u].data(), base[u]));
    if (!r.ok()) return r.status();
    cached[u] = r->prefix;
    return kv->CommitAppend(u, r->prefix);
  }
  std::span<const uint64_t> Request(uint32_t u) const {  // cached prefix + kNewTokens
    return std::span(history[u].data(), cached[u].len + kNewTokens);
  }
  std::span<const uint64_t> NewTokens(uint32_t u) const {
    return std::span(history[u].data() + cached[u].len, kNewTokens);
  }
};

absl::StatusOr<std::unique_ptr<RequestWorld>> BuildRequestWorld(const Sizes& sz) {
  auto w = std::make_unique<RequestWorld>();
  Rng rng(kSeed);
  std::uniform_int_distribution<uint64_t> length(256, 2048);
  uint64_t pages = 0;
  for (uint32_t u = 0; u < sz.kv_users; ++u) {
    w->base.push_back(length(rng));
    w->history.emplace_back(w->base.back() + kGrowth + kNewTokens);
    for (uint64_t& t : w->history.back()) t = rng();
    pages += w->history.back().size() / 32 + 2;
  }
  w->cached.resize(sz.kv_users);
  std::uniform_int_distribution<uint32_t> user(0, sz.kv_users - 1);
  w->sequence.resize(size_t{1} << 16);
  for (uint32_t& u : w->sequence) u = user(rng);
  auto pool = HbmPool::Create({.pool_bytes = pages * (64 << 10), .page_bytes = 64 << 10});
  if (!pool.ok()) return pool.status();
  w->pool = std::move(*pool);
  // 2 layers · K and V · kv_dim 128 · fp32 = 2 KiB per token: 32 tokens per 64 KiB page.
  auto kv =
      KvCache::Create({.layers = 2, .kv_dim = 128, .dtype_bytes = 4}, *w->pool, nullptr, w->clock);
  if (!kv.ok()) return kv.status();
  w->kv = std::move(*kv);
  for (uint32_t u = 0; u < sz.kv_users; ++u) {
    absl::Status s = w->Reset(u);
    if (!s.ok()) return s;
  }
  return w;
}

RequestWorld* GetRequestWorld(const Sizes& sz, std::string* error) {
  static std::unique_ptr<RequestWorld> world;
  if (world != nullptr) return world.get();
  auto built = BuildRequestWorld(sz);
  if (!built.ok()) {
    *error = built.status().ToString();
    return nullptr;
  }
  world = std::move(*built);
  return world.get();
}

enum class KvOp { kLookup, kAppend, kRequest };

void KvPerRequest(benchmark::State& state, const Sizes* sz, KvOp op) {
  std::string error;
  RequestWorld* w = GetRequestWorld(*sz, &error);
  if (w == nullptr) {
    state.SkipWithError(error.c_str());
    return;
  }
  KvCache& kv = *w->kv;
  double tokens = 0;
  for (auto _ : state) {
    const uint32_t u = w->NextUser();
    if (op != KvOp::kLookup && w->cached[u].len + kNewTokens > w->base[u] + kGrowth) {
      state.PauseTiming();
      absl::Status s = w->Reset(u);
      state.ResumeTiming();
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        break;
      }
    }
    KvPrefix expected = w->cached[u];
    if (op == KvOp::kRequest) kv.Pin(u);
    if (op != KvOp::kAppend) {
      tokens += static_cast<double>(expected.len + kNewTokens);
      serving::KvLookupResult r = kv.Lookup(u, w->Request(u));
      if (r.prefix != expected) {
        state.SkipWithError(absl::StrCat("user ", u, ": lookup reused ", r.prefix.len, " of ",
                                         expected.len, " cached tokens")
                                .c_str());
        break;
      }
      benchmark::DoNotOptimize(r.pages.data());
    }
    if (op != KvOp::kLookup) {
      auto r = kv.Append(u, expected, w->NewTokens(u));
      absl::Status s = r.ok() ? kv.CommitAppend(u, r->prefix) : r.status();
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        break;
      }
      w->cached[u] = r->prefix;
    }
    if (op == KvOp::kRequest && !kv.Unpin(u).ok()) {
      state.SkipWithError("Unpin failed");
      break;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  // History tokens Lookup hashed per request (the histories grow under append16 and request).
  state.counters["tokens"] = tokens / std::max<double>(1, static_cast<double>(state.iterations()));
}

// ---------------------------------------------------------------------------------------------
// Reporting.

// Forwards to the default display reporter and keeps each case's time per iteration (seconds)
// and counters: the median aggregate when there are repetitions, else the single run.
class CapturingReporter final : public benchmark::BenchmarkReporter {
 public:
  struct Result {
    double seconds = 0;
    std::map<std::string, double> counters;
    bool median = false;
  };

  explicit CapturingReporter(benchmark::BenchmarkReporter* display) : display_(display) {}

  bool ReportContext(const Context& context) override { return display_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      Result& r = results_[run.run_name.function_name];
      if (run.run_type == Run::RT_Aggregate) {
        if (run.aggregate_name != "median") continue;
        r = Result{.median = true};
      } else if (r.median) {
        continue;
      }
      r.seconds = run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit);
      for (const auto& [name, counter] : run.counters) r.counters[name] = counter.value;
    }
    display_->ReportRuns(runs);
  }
  void Finalize() override { display_->Finalize(); }

  const Result* Find(const std::string& name) const {
    auto it = results_.find(name);
    return it == results_.end() ? nullptr : &it->second;
  }
  double Counter(const std::string& name, const std::string& counter) const {
    const Result* r = Find(name);
    if (r == nullptr) return 0;
    auto it = r->counters.find(counter);
    return it == r->counters.end() ? 0 : it->second;
  }
  bool any_median() const {
    return std::any_of(results_.begin(), results_.end(),
                       [](const auto& r) { return r.second.median; });
  }

 private:
  benchmark::BenchmarkReporter* display_;  // not owned (the library keeps it)
  std::map<std::string, Result> results_;
};

std::string HitName(uint32_t row_bytes, const std::string& variant) {
  return absl::StrCat("emb_hit/rows", row_bytes == 256 ? "256" : "2k", "/", variant);
}

void PrintHitSummary(const CapturingReporter& rep) {
  std::printf("\nEMB hit path, %u Zipf(%.1f) rows per batch, all hits (%s)\n", kBatch,
              kZipfExponent, rep.any_median() ? "medians of the repetitions" : "single runs");
  std::printf("%-8s %22s %30s %30s\n", "rows", "flat_gather", "lru", "tinylfu");
  std::printf("%-8s %11s %10s %11s %10s %7s %11s %10s %7s\n", "", "Mrows/s", "GB/s", "Mrows/s",
              "GB/s", "ratio", "Mrows/s", "GB/s", "ratio");
  std::vector<std::string> verdicts;
  for (uint32_t rb : {256u, 2048u}) {
    const double flat = rep.Counter(HitName(rb, "flat_gather"), "items_per_second");
    std::string line = absl::StrFormat("%-8s %11.1f %10.2f", rb == 256 ? "256 B" : "2 KiB",
                                       flat / 1e6, flat * rb / 1e9);
    for (const char* policy : {"lru", "tinylfu"}) {
      const double rps = rep.Counter(HitName(rb, policy), "items_per_second");
      const double ratio = flat > 0 ? rps / flat : 0;
      absl::StrAppendFormat(&line, " %11.1f %10.2f %6.1f%%", rps / 1e6, rps * rb / 1e9,
                            100 * ratio);
      verdicts.push_back(absl::StrFormat("%s %s: %.1f%% of the plain gather, %s", policy,
                                         rb == 256 ? "256 B" : "2 KiB", 100 * ratio,
                                         ratio >= kTargetHitRatio ? "MET" : "NOT MET"));
    }
    std::printf("%s\n", line.c_str());
  }
  std::printf("ns per row: ");
  for (uint32_t rb : {256u, 2048u}) {
    for (const char* v : {"flat_gather", "index_floor", "lru", "lru_lookup_only", "tinylfu",
                          "tinylfu_lookup_only"}) {
      const double rps = rep.Counter(HitName(rb, v), "items_per_second");
      if (rps > 0) std::printf("%s %.1f  ", HitName(rb, v).substr(8).c_str(), 1e9 / rps);
    }
  }
  for (uint32_t rb : {256u, 2048u}) {
    const double flat = rep.Counter(HitName(rb, "flat_gather"), "items_per_second");
    const double floor = rep.Counter(HitName(rb, "index_floor"), "items_per_second");
    if (flat > 0 && floor > 0) {
      std::printf(
          "\nindex_floor %s (one-line probe + gather, no recency): %.1f%% of the plain gather",
          rb == 256 ? "256 B" : "2 KiB", 100 * floor / flat);
    }
  }
  std::printf("\nTarget: >= %.0f%% of the plain gather\n", 100 * kTargetHitRatio);
  for (const std::string& v : verdicts) std::printf("  %s\n", v.c_str());
}

void PrintMoveSummary(const CapturingReporter& rep, uint32_t pool_pages) {
  std::printf("\nMoving pages, pool of %u pages of 2 MiB, metadata only\n", pool_pages);
  std::printf("%-20s %6s %10s %10s %10s %10s %12s  %s\n", "case", "pages", "entries", "time_ms",
              "ns/page", "query_us", "drain calls", "target (<= 1 us/page, <= 5 ms)");
  for (const char* name : {"emb_shrink/lru", "emb_shrink/tinylfu", "kv_reclaim"}) {
    const CapturingReporter::Result* r = rep.Find(name);
    if (r == nullptr) continue;
    const double pages = rep.Counter(name, "pages");
    const double ns = pages > 0 ? r->seconds * 1e9 / pages : 0;
    const bool kv = std::string_view(name) == "kv_reclaim";
    const bool met = ns <= kTargetNsPerPage && r->seconds <= kTargetChangeSeconds;
    std::printf("%-20s %6.0f %10.0f %10.3f %10.1f %10s %12s  %s\n", name, pages,
                rep.Counter(name, kv ? "users_evicted" : "entries"), r->seconds * 1e3, ns,
                kv ? "-" : absl::StrFormat("%.1f", rep.Counter(name, "query_us")).c_str(),
                kv ? "-"
                   : absl::StrFormat("%.0f, max %.2f ms", rep.Counter(name, "drain_calls"),
                                     rep.Counter(name, "drain_max_ms"))
                         .c_str(),
                met ? "MET" : "NOT MET");
  }
  std::printf(
      "(kv_reclaim: the entries column is users evicted whole; query_us: one ResidentRows\n"
      " right after the Shrink; drain calls: DrainPending(4096) calls to subtract the rest)\n");
}

void PrintKvSummary(const CapturingReporter& rep) {
  std::printf("\nKV per request (2 layers, kv_dim 128, fp32, 32-token pages, +%u tokens)\n",
              kNewTokens);
  for (const char* name : {"kv/lookup", "kv/append16", "kv/request"}) {
    const CapturingReporter::Result* r = rep.Find(name);
    if (r == nullptr) continue;
    const double tokens = rep.Counter(name, "tokens");
    std::printf("  %-12s %9.0f ns", name, r->seconds * 1e9);
    if (tokens > 0) std::printf("  (%.0f history tokens hashed)", tokens);
    std::printf("\n");
  }
}

void PopularityRecord(benchmark::State& state, const Sizes* sz) {
  constexpr size_t kBatch = 1024;
  auto sketch = *serving::PopularitySketch::Create({.capacity = 65536});
  Rng rng(3);
  ZipfSampler zipf(uint64_t{1} << 24, kZipfExponent);
  std::vector<uint64_t> ids(std::max(sz->zipf_ids, kBatch));
  for (uint64_t& id : ids) id = zipf(rng);
  for (size_t i = 0; i + kBatch <= ids.size(); i += kBatch) {
    sketch->RecordBatch(0, std::span<const uint64_t>(ids.data() + i, kBatch));
  }
  size_t at = 0;
  for (auto _ : state) {
    if (at + kBatch > ids.size()) at = 0;
    sketch->RecordBatch(0, std::span<const uint64_t>(ids.data() + at, kBatch));
    at += kBatch;
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kBatch));
}

int Main(int argc, char** argv) {
  bool smoke = false;
  std::vector<std::string> defaults = {"--benchmark_min_time=0.3", "--benchmark_repetitions=3",
                                       "--benchmark_display_aggregates_only=true"};
  for (int i = 1; i < argc; ++i) smoke = smoke || std::string_view(argv[i]) == "--smoke";
  if (smoke) defaults = {"--benchmark_min_time=0.01", "--benchmark_repetitions=1"};
  // Our defaults go first so that the same flags given on the command line override them.
  std::vector<char*> args = {argv[0]};
  for (std::string& d : defaults) args.push_back(d.data());
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--smoke") args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;

  static Sizes sz;
  if (smoke) {
    sz.hit_pool_bytes = uint64_t{32} << 20;
    sz.zipf_ids = size_t{1} << 16;
    sz.move_pages = 1024;
    sz.reclaim_users = 250;
    sz.kv_users = 100;
    sz.move_iterations = 2;
  }
  for (uint32_t rb : {256u, 2048u}) {
    benchmark::RegisterBenchmark(HitName(rb, "flat_gather").c_str(), EmbHitFlat, &sz, rb)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(HitName(rb, "index_floor").c_str(), EmbHitFloor, &sz, rb)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    for (int mode = 0; mode < 3; ++mode) {  // gather, lookup only, pinned lookup + unpin
      const bool lookup_only = mode > 0, pinned = mode == 2;
      for (EmbPolicy policy : {EmbPolicy::kLru, EmbPolicy::kTinyLfu}) {
        std::string variant = serving::EmbPolicyName(policy);
        if (lookup_only) variant += pinned ? "_pinned" : "_lookup_only";
        benchmark::RegisterBenchmark(HitName(rb, variant).c_str(), EmbHitCached, &sz, rb, policy,
                                     lookup_only, pinned)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  for (EmbPolicy policy : {EmbPolicy::kLru, EmbPolicy::kTinyLfu}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("emb_shrink/", serving::EmbPolicyName(policy)).c_str(), EmbShrink, &sz, policy,
        smoke)
        ->UseManualTime()
        ->Iterations(sz.move_iterations)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("kv_reclaim", KvReclaim, &sz, smoke)
      ->UseManualTime()
      ->Iterations(sz.move_iterations)
      ->Unit(benchmark::kMillisecond);
  for (auto [name, op] :
       {std::pair{"kv/lookup", KvOp::kLookup}, std::pair{"kv/append16", KvOp::kAppend},
        std::pair{"kv/request", KvOp::kRequest}}) {
    benchmark::RegisterBenchmark(name, KvPerRequest, &sz, op)->UseRealTime();
  }

  benchmark::RegisterBenchmark("popularity/record_batch", PopularityRecord, &sz)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);

  CapturingReporter reporter(benchmark::CreateDefaultDisplayReporter());
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  PrintHitSummary(reporter);
  PrintMoveSummary(reporter, sz.move_pages);
  PrintKvSummary(reporter);
  return 0;
}

}  // namespace
}  // namespace hlem::bench

int main(int argc, char** argv) { return hlem::bench::Main(argc, argv); }
