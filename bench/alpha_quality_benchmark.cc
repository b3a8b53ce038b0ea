// How well the memory system follows an α change, in simulated time (issue 3):
//
// shrink: the EMB hit rate and the rows fetched in the first second after α drops 10 % (the EMB
//   cache gives back its 10 % coldest pages, metadata only), next to an ideal LRU of the new size
//   run on the same trace from the start. Targets: hit rate within 2 points, rows fetched
//   <= 1.1x the ideal's. Zipf 1.0 and 0.8, both replacement policies.
// grow: SetAlpha up 10 % on a pool whose KV side is full of idle users, with the MemoryManager's
//   Step on its timer and the Refiller filling the won pages through the emulated link of the
//   local profile while live misses use the same link. Targets: effective α = target within
//   1 s; refill of the won pages finished within one 5 s window.
//
// Everything runs on a SimClock: the figures are deterministic for a seed and do not depend on
// the machine (only the local profile's link rate does, when measured; see
// --link-bytes-per-second). Own harness rather than Google Benchmark: the results are simulated
// seconds and hit rates, not wall-clock time. `--smoke` runs small sizes and checks the invariants
// (CTest, label bench).

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "common/clock.h"
#include "common/rng.h"
#include "common/zipf.h"
#include "serving_node/core/emb_cache.h"
#include "serving_node/core/hbm_pool.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/memory_manager.h"
#include "serving_node/core/popularity.h"
#include "serving_node/core/refill.h"
#include "serving_node/core/row_source.h"
#include "serving_node/device/cpu_device.h"

namespace hlem::bench {
namespace {

using serving::CopyClass;
using serving::CopyPurpose;
using serving::CpuDevice;
using serving::EmbCache;
using serving::EmbLookupResult;
using serving::EmbPolicy;
using serving::EmbPolicyName;
using serving::EmbReservation;
using serving::HbmPool;
using serving::KvCache;
using serving::MemoryManager;
using serving::MemoryState;
using serving::PageOwner;
using serving::PopularitySketch;
using serving::Refiller;
using serving::RefillStats;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "alpha_quality_benchmark: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(std::string(what) + ": " + std::string(v.status().message()));
  return std::move(v).value();
}
void Must(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + std::string(s.message()));
}

// A request's rows: `batch` Zipf draws over `rows` ranks, scattered over the table by a hash of
// the rank, deduplicated (the node looks up each row of a request once).
class Trace {
 public:
  Trace(uint64_t rows, double exponent, uint32_t batch, uint64_t seed)
      : rows_(rows), zipf_(rows, exponent), batch_(batch), rng_(seed) {}
  const std::vector<uint64_t>& Next() {
    seen_.clear();
    out_.clear();
    for (uint32_t i = 0; i < batch_; ++i) {
      const uint64_t row = Mix64(zipf_(rng_) ^ 0x9e3779b97f4a7c15ULL) % rows_;
      if (seen_.insert(row).second) out_.push_back(row);
    }
    return out_;
  }

 private:
  const uint64_t rows_;
  ZipfSampler zipf_;
  const uint32_t batch_;
  Rng rng_;
  absl::flat_hash_set<uint64_t> seen_;
  std::vector<uint64_t> out_;
};

// Exact LRU of a fixed number of rows: the reference a page-granular shrink is judged against.
class IdealLru {
 public:
  explicit IdealLru(uint64_t capacity) : capacity_(capacity) {}
  // True on a hit; a miss admits the row, evicting the least recently used when full.
  bool Access(uint64_t row) {
    auto it = index_.find(row);
    if (it != index_.end()) {
      Unlink(it->second);
      PushFront(it->second);
      return true;
    }
    uint32_t n;
    if (nodes_.size() < capacity_) {
      n = static_cast<uint32_t>(nodes_.size());
      nodes_.push_back({});
    } else {
      n = tail_;
      Unlink(n);
      index_.erase(nodes_[n].row);
    }
    nodes_[n].row = row;
    index_[row] = n;
    PushFront(n);
    return false;
  }

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  struct Node {
    uint64_t row = 0;
    uint32_t prev = kNil, next = kNil;
  };
  void Unlink(uint32_t n) {
    Node& x = nodes_[n];
    (x.prev != kNil ? nodes_[x.prev].next : head_) = x.next;
    (x.next != kNil ? nodes_[x.next].prev : tail_) = x.prev;
  }
  void PushFront(uint32_t n) {
    nodes_[n].prev = kNil;
    nodes_[n].next = head_;
    (head_ != kNil ? nodes_[head_].prev : tail_) = n;
    head_ = n;
  }
  const uint64_t capacity_;
  std::vector<Node> nodes_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
  uint32_t head_ = kNil, tail_ = kNil;
};

struct Sizes {
  // shrink
  uint64_t page_bytes = 2 << 20;  // the node's page size
  uint32_t row_bytes = 256;
  uint32_t cache_pages = 80;  // 655 360 slots of 256 B before the drop, 8 pages given back
  uint64_t table_rows = 16 << 20;
  uint32_t batch = 512;                // rows per request
  uint64_t rows_per_second = 512'000;  // 1 000 requests/s of 512 rows
  uint64_t warmup_rows = 16 * 655'360;
  int seconds_after = 5;
  // grow
  uint64_t grow_pool_pages = 1000;
  double grow_alpha_from = 0.4;
  double grow_alpha_to = 0.5;
};

// --- shrink ------------------------------------------------------------------------------------

struct ShrinkResult {
  std::vector<double> hit_rate;   // per second after the drop
  std::vector<uint64_t> fetched;  // rows fetched (misses) per second
  std::vector<double> ideal_hit;  // ideal LRU of the new size
  std::vector<uint64_t> ideal_fetch;
  double hit_before = 0;  // our cache, the second before the drop
  uint32_t pages_shrunk = 0;
  uint64_t entries_dropped = 0;
};

ShrinkResult RunShrink(const Sizes& sz, EmbPolicy policy, double exponent, bool smoke) {
  SimClock clock;
  const uint32_t pool_pages = sz.cache_pages + 1;
  auto pool =
      Must(HbmPool::Create({.pool_bytes = pool_pages * sz.page_bytes, .page_bytes = sz.page_bytes}),
           "pool");
  auto cache = Must(EmbCache::Create({.tables = {{.table_id = 0, .row_bytes = sz.row_bytes}},
                                      .policy = policy,
                                      .budget_pages = sz.cache_pages},
                                     *pool, clock),
                    "cache");
  const uint64_t slots_per_page = sz.page_bytes / sz.row_bytes;
  const uint32_t shrink_pages = sz.cache_pages / 10;
  IdealLru ideal((sz.cache_pages - shrink_pages) * slots_per_page);
  Trace trace(sz.table_rows, exponent, sz.batch, 42);

  EmbLookupResult r;
  std::vector<uint64_t> misses, offsets;
  uint64_t hits = 0, looked = 0, ideal_hits = 0;
  auto request = [&] {
    const std::vector<uint64_t>& rows = trace.Next();
    Must(cache->Lookup(0, rows, &r), "lookup");
    misses.clear();
    for (uint32_t p : r.miss_positions) misses.push_back(rows[p]);
    offsets.clear();
    Must(cache->InsertBatch(0, misses, &offsets), "insert");
    hits += r.hits;
    looked += rows.size();
    for (uint64_t row : rows) ideal_hits += ideal.Access(row);
  };
  // Runs requests until `n` rows were looked up; returns (hits, looked, ideal hits).
  auto run_rows = [&](uint64_t n) {
    hits = looked = ideal_hits = 0;
    while (looked < n) request();
  };

  ShrinkResult res;
  run_rows(sz.warmup_rows);
  run_rows(sz.rows_per_second);
  res.hit_before = static_cast<double>(hits) / looked;
  const uint64_t entries_before = cache->GetStats().entries;
  std::vector<serving::PageId> freed;
  res.pages_shrunk = cache->Shrink(shrink_pages, &freed);
  res.entries_dropped = entries_before - cache->GetStats().entries;
  for (int s = 0; s < sz.seconds_after; ++s) {
    run_rows(sz.rows_per_second);
    res.hit_rate.push_back(static_cast<double>(hits) / looked);
    res.fetched.push_back(looked - hits);
    res.ideal_hit.push_back(static_cast<double>(ideal_hits) / looked);
    res.ideal_fetch.push_back(looked - ideal_hits);
  }
  if (smoke) Must(cache->CheckInvariants(), "emb invariants");
  return res;
}

// --- grow --------------------------------------------------------------------------------------

// The local profile's link (ARCHITECTURE §9): the host's FLOP/s on one thread divided by
// 12.5 kFLOP/B (an A100's 312 TFLOP/s over 25 GB/s). Until the HSTU model exists (issue 4) the
// FLOP/s are those of a 512×512 fp32 GEMM through Eigen on one thread, the model's main operation.
double MeasureGemmFlops() {
  Eigen::setNbThreads(1);
  constexpr int kN = 512;
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(kN, kN), b = Eigen::MatrixXf::Random(kN, kN), c;
  c.noalias() = a * b;  // warm
  int reps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double seconds = 0;
  while (seconds < 0.5) {
    c.noalias() = a * b;
    ++reps;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (c(0, 0) == 12345.0f) std::printf(" ");  // keep the product
  return 2.0 * kN * kN * kN * reps / seconds;
}

// Serves zeros: the grow experiment times the link, not the bytes.
class ZeroRowSource final : public serving::RowSource {
 public:
  absl::Status Fetch(uint32_t, std::span<const uint64_t>, std::span<std::byte> out,
                     absl::Time) override {
    std::fill(out.begin(), out.end(), std::byte{0});
    return absl::OkStatus();
  }
};

double P99(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) * 99 / 100];
}

struct GrowResult {
  double link_bytes_per_second = 0;
  uint64_t pool_bytes = 0;
  uint32_t pages = 0;
  uint32_t pages_won = 0;
  double effective_s = -1;    // SetAlpha -> effective α = target
  double refill_done_s = -1;  // SetAlpha -> the won pages full (no free EMB slot)
  uint64_t refill_bytes = 0;
  uint64_t refill_rows = 0;
  uint64_t refill_deferred_critical = 0;  // refill ticks that waited for a live miss's copy
  uint64_t refill_deferred_rate = 0;      // ... for the token bucket
  uint64_t miss_bytes = 0;                // live misses during the refill
  double link_utilisation = 0;
  // A request's miss copies, submit to the last one landed: P99 the second before the change
  // (no refill) and from the change until the won pages are full (refill running).
  double miss_p99_before_ms = 0;
  double miss_p99_ms = 0;
  double miss_max_ms = 0;
  double hit_before = 0, hit_after = 0;  // EMB hit rate the second before / after the refill
};

GrowResult RunGrow(const Sizes& sz, double link_bytes_per_second, bool smoke) {
  GrowResult res;
  res.link_bytes_per_second = link_bytes_per_second;
  SimClock clock;
  // The A100's pool-to-link ratio: 80 GB over 25 GB/s = 3.2 s of link time.
  constexpr uint64_t kPageBytes = 64 << 10;
  constexpr uint32_t kRowBytes = 256;
  res.pages = std::max<uint32_t>(
      20, static_cast<uint32_t>(3.2 * link_bytes_per_second / static_cast<double>(kPageBytes)));
  res.pool_bytes = uint64_t{res.pages} * kPageBytes;
  auto pool =
      Must(HbmPool::Create({.pool_bytes = res.pool_bytes, .page_bytes = kPageBytes}), "pool");
  serving::LinkOptions link{.bytes_per_second = link_bytes_per_second,
                            .latency = absl::Microseconds(5)};
  auto device =
      Must(CpuDevice::Create({.pool_bytes = res.pool_bytes, .link = link}, clock), "device");
  auto kv = Must(
      KvCache::Create({.layers = 2, .kv_dim = 64, .dtype_bytes = 4}, *pool, nullptr, clock), "kv");
  auto emb = Must(
      EmbCache::Create({.tables = {{.table_id = 0, .row_bytes = kRowBytes}}}, *pool, clock), "emb");
  auto manager =
      Must(MemoryManager::Create({.initial_alpha = sz.grow_alpha_from}, *pool, *kv, *emb, clock),
           "manager");
  auto sketch = Must(PopularitySketch::Create({.capacity = 65536}), "sketch");
  ZeroRowSource source;
  // Refill gets half the link; a chunk is 16 ms of link time (at most 1 MiB), so a live miss
  // waits at most that long behind one.
  const uint64_t chunk = std::clamp<uint64_t>(
      static_cast<uint64_t>(link_bytes_per_second * 0.016) / kRowBytes * kRowBytes, kRowBytes,
      1 << 20);
  auto refiller = Must(Refiller::Create({.chunk_bytes = chunk,
                                         .max_copy_bytes = chunk,
                                         .bytes_per_second = 0.5 * link_bytes_per_second,
                                         .burst_bytes = 2 * chunk,
                                         .poll_interval = absl::Milliseconds(1)},
                                        *emb, *device, source, *sketch, clock),
                       "refiller");

  // Live requests: Zipf(1.0) rows of a 4 Mi-row table, 256 per request; misses are reserved,
  // copied as critical transfers and committed when the copy lands, as the node does.
  Trace trace(4 << 20, 1.0, 256, 7);
  std::vector<std::byte> zeros(256 * kRowBytes);
  EmbLookupResult r;
  EmbReservation reservation;
  std::vector<double> critical_ms;
  bool record_critical = false;
  uint64_t hits = 0, looked = 0, miss_bytes = 0;
  auto request = [&] {
    const std::vector<uint64_t>& rows = trace.Next();
    Must(emb->Lookup(0, rows, &r), "lookup");
    sketch->RecordBatch(0, rows);
    hits += r.hits;
    looked += rows.size();
    std::vector<uint64_t> misses;
    for (uint32_t p : r.miss_positions) misses.push_back(rows[p]);
    if (misses.empty()) return;
    absl::Status st = emb->ReserveBatch(0, misses, &reservation);
    if (!st.ok() && st.code() != absl::StatusCode::kResourceExhausted) Must(st, "reserve");
    auto reserved = std::make_shared<std::vector<uint64_t>>();
    for (uint32_t p : reservation.reserved_positions) reserved->push_back(misses[p]);
    if (reserved->empty()) return;
    auto left = std::make_shared<size_t>(reserved->size());
    const absl::Time submitted = clock.Now();
    const bool rec = record_critical;
    for (uint32_t p : reservation.reserved_positions) {
      miss_bytes += kRowBytes;
      device->CopyToPool(
          CopyClass::kCritical, CopyPurpose::kEmbMiss, zeros.data(), reservation.offsets[p],
          kRowBytes, [&, reserved, left, submitted, rec](absl::Status cst) {
            Must(cst, "miss copy");
            if (--*left > 0) return;
            Must(emb->Commit(0, *reserved), "commit");
            if (rec) critical_ms.push_back(absl::ToDoubleMilliseconds(clock.Now() - submitted));
          });
    }
  };
  // Requests at a rate whose misses take about 30 % of the link at the starting hit rate.
  const double request_interval_s =
      1.0 / std::max(1.0, 0.3 * link_bytes_per_second / (0.6 * 256 * kRowBytes));
  const absl::Duration request_interval = absl::Seconds(request_interval_s);
  auto run_for = [&](absl::Duration d, const std::function<bool()>& stop) {
    const absl::Time end = clock.Now() + d;
    while (clock.Now() < end) {
      request();
      clock.AdvanceBy(request_interval);
      if (stop && stop()) return;
    }
  };

  // Start: the KV side full of idle users, the EMB side warm (misses admitted).
  manager->Start();
  {
    // Users of 4 pages while 4 more fit (Append would evict the oldest user to fit a fifth).
    const uint32_t tokens = 4 * kv->page_tokens();
    uint64_t user = 0;
    while (pool->free_pages() >= 4 && pool->pages_owned(PageOwner::kKv) + 4 <= kv->budget_pages()) {
      std::vector<uint64_t> history(tokens);
      for (uint32_t i = 0; i < tokens; ++i) history[i] = KeyedHash(user, i);
      auto append = kv->Append(user, serving::KvPrefix{}, history);
      if (!append.ok() || !kv->CommitAppend(user, append->prefix).ok()) break;
      ++user;
    }
  }
  run_for(absl::Seconds(20), nullptr);
  hits = looked = 0;
  record_critical = true;
  run_for(absl::Seconds(1), nullptr);
  record_critical = false;
  res.hit_before = static_cast<double>(hits) / looked;
  res.miss_p99_before_ms = P99(critical_ms);
  critical_ms.clear();

  // α up 10 %: the EMB budget grows as Step reclaims idle KV users; the node kicks the refiller
  // whenever the EMB budget grew (here: checked after every request).
  const absl::Time t0 = clock.Now();
  const serving::DeviceCopyStats before = device->stats();
  const uint32_t emb_pages_before = manager->State().emb_pages;
  const uint64_t changes_before = manager->State().alpha_changes;
  Must(manager->SetAlpha(sz.grow_alpha_to, 2).status(), "set alpha");
  uint32_t budget_seen = 0;
  record_critical = true;
  miss_bytes = 0;
  run_for(absl::Seconds(10), [&] {
    MemoryState st = manager->State();
    if (st.emb_budget_pages > budget_seen) {
      budget_seen = st.emb_budget_pages;
      refiller->Kick();
    }
    // The manager times the change itself (SetAlpha to the Step that met the target).
    if (res.effective_s < 0 && st.converged && st.alpha_changes > changes_before) {
      res.effective_s = absl::ToDoubleSeconds(st.last_convergence);
    }
    if (res.effective_s >= 0 && emb->FreeSlots(0) == 0 && emb->GetStats().pending_entries == 0) {
      res.refill_done_s = absl::ToDoubleSeconds(clock.Now() - t0);
      return true;
    }
    return false;
  });
  record_critical = false;
  const RefillStats rs = refiller->GetStats();
  res.refill_rows = rs.rows_refilled;
  res.refill_deferred_critical = rs.deferred_critical;
  res.refill_deferred_rate = rs.deferred_rate;
  const serving::DeviceCopyStats after = device->stats();
  res.pages_won = manager->State().emb_pages - emb_pages_before;
  constexpr int kRefill = static_cast<int>(CopyPurpose::kEmbRefill);
  res.refill_bytes = after.bytes[kRefill] - before.bytes[kRefill];
  res.miss_bytes = miss_bytes;
  const double elapsed = absl::ToDoubleSeconds(clock.Now() - t0);
  res.link_utilisation =
      elapsed > 0 ? static_cast<double>(after.link_busy_ns - before.link_busy_ns) / 1e9 / elapsed
                  : 0;
  res.miss_p99_ms = P99(critical_ms);
  res.miss_max_ms =
      critical_ms.empty() ? 0 : *std::max_element(critical_ms.begin(), critical_ms.end());
  hits = looked = 0;
  run_for(absl::Seconds(1), nullptr);
  res.hit_after = static_cast<double>(hits) / looked;

  manager->Stop();
  refiller.reset();
  while (clock.RunNext()) {
  }
  if (smoke) {
    Must(emb->CheckInvariants(), "emb invariants");
    Must(kv->CheckInvariants(), "kv invariants");
  }
  return res;
}

// --- entry -------------------------------------------------------------------------------------

int Main(int argc, char** argv) {
  bool smoke = false;
  double link_override = 0;
  constexpr std::string_view kLinkFlag = "--link-bytes-per-second=";
  for (int i = 1; i < argc; ++i) {
    std::string_view a(argv[i]);
    if (a == "--smoke") {
      smoke = true;
    } else if (a.substr(0, kLinkFlag.size()) == kLinkFlag) {
      if (!absl::SimpleAtod(std::string(a.substr(kLinkFlag.size())), &link_override) ||
          !(link_override > 0)) {
        Die("--link-bytes-per-second: expected a positive number, got '" +
            std::string(a.substr(kLinkFlag.size())) + "'");
      }
    } else {
      Die("unknown argument '" + std::string(a) + "' (known: --smoke, --link-bytes-per-second=X)");
    }
  }
  Sizes sz;
  if (smoke) {
    sz.page_bytes = 64 << 10;
    sz.cache_pages = 40;
    sz.table_rows = 1 << 20;
    sz.rows_per_second = 50'000;
    sz.warmup_rows = 200'000;
    sz.seconds_after = 2;
  }

  std::printf(
      "Shrink quality: EMB cache of %u pages of %llu KiB (%u B rows), α drops 10 %%\n"
      "(%u pages given back); %llu rows looked up per second in requests of %u; ideal =\n"
      "exact LRU of the new size on the same trace since the start\n",
      sz.cache_pages, static_cast<unsigned long long>(sz.page_bytes >> 10), sz.row_bytes,
      sz.cache_pages / 10, static_cast<unsigned long long>(sz.rows_per_second), sz.batch);
  std::printf("%-8s %-8s %9s | %9s %9s %7s | %9s %9s %6s | %s\n", "zipf", "policy", "before",
              "hit 1st s", "ideal", "diff", "fetched", "ideal", "ratio", "verdict");
  bool all_met = true;
  for (double exponent : {1.0, 0.8}) {
    for (EmbPolicy policy : {EmbPolicy::kLru, EmbPolicy::kTinyLfu}) {
      const auto t0 = std::chrono::steady_clock::now();
      ShrinkResult res = RunShrink(sz, policy, exponent, smoke);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double diff = (res.hit_rate[0] - res.ideal_hit[0]) * 100;
      const double ratio = static_cast<double>(res.fetched[0]) / res.ideal_fetch[0];
      const bool met = diff >= -2.0 && ratio <= 1.1;
      all_met = all_met && met;
      std::printf("%-8.1f %-8s %8.2f%% | %8.2f%% %8.2f%% %+6.2f | %9llu %9llu %5.3fx | %s\n",
                  exponent, EmbPolicyName(policy), res.hit_before * 100, res.hit_rate[0] * 100,
                  res.ideal_hit[0] * 100, diff, static_cast<unsigned long long>(res.fetched[0]),
                  static_cast<unsigned long long>(res.ideal_fetch[0]), ratio,
                  met ? "MET" : "NOT MET");
      std::printf("         seconds 1..%d after the drop, hit rate (ideal):", sz.seconds_after);
      for (size_t s = 0; s < res.hit_rate.size(); ++s) {
        std::printf(" %.2f%% (%.2f%%)", res.hit_rate[s] * 100, res.ideal_hit[s] * 100);
      }
      std::printf("\n         %u pages, %llu entries dropped; %.1f s wall\n", res.pages_shrunk,
                  static_cast<unsigned long long>(res.entries_dropped), wall);
    }
  }
  std::printf("Targets: hit rate within 2 points of the ideal, rows fetched <= 1.1x: %s\n\n",
              all_met ? "all MET" : "NOT all met");

  const double flops = MeasureGemmFlops();
  const double link = link_override > 0 ? link_override : flops / 12.5e3;
  GrowResult g = RunGrow(sz, link, smoke);
  std::printf(
      "Responsiveness, local profile: GEMM %.1f GFLOP/s on one thread -> link %.2f MB/s%s;\n"
      "pool %llu pages of 64 KiB (%.1f MB = 3.2 s of link, the A100's ratio), KV side full of\n"
      "idle users, live Zipf requests; SetAlpha %.2f -> %.2f\n",
      flops / 1e9, link / 1e6, link_override > 0 ? " (given)" : "",
      static_cast<unsigned long long>(g.pages), g.pool_bytes / 1e6, sz.grow_alpha_from,
      sz.grow_alpha_to);
  const bool eff_met = g.effective_s >= 0 && g.effective_s <= 1.0;
  const bool refill_met = g.refill_done_s >= 0 && g.refill_done_s <= 5.0;
  std::printf("  effective α = target after   %8.3f s   (target <= 1 s): %s\n", g.effective_s,
              eff_met ? "MET" : "NOT MET");
  std::printf("  won pages full after         %8.3f s   (target <= 5 s): %s\n", g.refill_done_s,
              refill_met ? "MET" : "NOT MET");
  std::printf(
      "  pages won %u; refill %.2f MB (%llu rows), live misses %.2f MB in that time; link busy "
      "%.0f %%\n",
      g.pages_won, g.refill_bytes / 1e6, static_cast<unsigned long long>(g.refill_rows),
      g.miss_bytes / 1e6, g.link_utilisation * 100);
  std::printf("  refill waited for live misses %llu times, for tokens %llu times\n",
              static_cast<unsigned long long>(g.refill_deferred_critical),
              static_cast<unsigned long long>(g.refill_deferred_rate));
  std::printf(
      "  a request's miss copies, P99: %.2f ms before the change, %.2f ms during the refill (max "
      "%.2f ms)\n",
      g.miss_p99_before_ms, g.miss_p99_ms, g.miss_max_ms);
  std::printf("  EMB hit rate the second before %.2f %%, the second after %.2f %%\n",
              g.hit_before * 100, g.hit_after * 100);
  if (smoke && (g.effective_s < 0 || g.refill_done_s < 0)) Die("smoke: the grow did not finish");
  return 0;
}

}  // namespace
}  // namespace hlem::bench

int main(int argc, char** argv) { return hlem::bench::Main(argc, argv); }
