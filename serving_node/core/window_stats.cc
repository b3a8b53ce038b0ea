#include "serving_node/core/window_stats.h"

#include <algorithm>

namespace hlem::serving {
namespace {

double Ratio(uint64_t num, uint64_t den) {
  return den == 0 ? 0.0 : static_cast<double>(num) / static_cast<double>(den);
}

// Counters only grow; a source that was recreated (reset) counts from zero again.
uint64_t Delta(uint64_t now, uint64_t before) { return now >= before ? now - before : now; }

}  // namespace

MemoryCounters ReadMemoryCounters(const KvCache& kv, const EmbCache& emb,
                                  const MemoryManager& manager, const Refiller* refiller,
                                  const Device& device, absl::Time now) {
  MemoryCounters c;
  c.at = now;
  const KvCacheStats k = kv.Stats();
  c.kv_lookups = k.lookups;
  c.kv_lookup_hits = k.lookup_hits;
  c.kv_tokens_requested = k.tokens_requested;
  c.kv_tokens_reused = k.tokens_reused;
  const EmbCacheStats e = emb.GetStats();
  c.emb_rows = e.hits + e.misses;
  c.emb_hits = e.hits;
  c.emb_bytes = e.bytes_held;
  const MemoryState m = manager.State();
  c.kv_bytes = uint64_t{m.kv_pages} * (m.pages == 0 ? 0 : device.pool_bytes() / m.pages);
  c.alpha_target = m.target_alpha;
  c.alpha_effective = m.effective_alpha;
  const DeviceCopyStats d = device.stats();
  c.link_busy_ns = d.link_busy_ns;
  c.miss_bytes = d.bytes[static_cast<int>(CopyPurpose::kEmbMiss)];
  if (refiller != nullptr) {
    const RefillStats r = refiller->GetStats();
    c.refill_bytes = r.bytes_refilled;
    c.refill_backlog_rows = r.backlog_rows;
  }
  return c;
}

void WindowAggregator::Start(const MemoryCounters& sample) {
  absl::MutexLock lock(&mu_);
  last_ = sample;
  started_ = true;
}

MemoryWindow WindowAggregator::Close(const MemoryCounters& sample) {
  absl::MutexLock lock(&mu_);
  if (!started_) {
    last_ = sample;
    started_ = true;
  }
  const MemoryCounters& a = last_;
  const MemoryCounters& b = sample;
  MemoryWindow w;
  w.index = next_index_++;
  w.start = a.at;
  w.duration = b.at - a.at;
  w.kv_requests = Delta(b.kv_lookups, a.kv_lookups);
  w.kv_hit_rate = Ratio(Delta(b.kv_tokens_reused, a.kv_tokens_reused),
                        Delta(b.kv_tokens_requested, a.kv_tokens_requested));
  w.kv_user_hit_rate = Ratio(Delta(b.kv_lookup_hits, a.kv_lookup_hits), w.kv_requests);
  w.emb_rows = Delta(b.emb_rows, a.emb_rows);
  w.emb_hit_rate = Ratio(Delta(b.emb_hits, a.emb_hits), w.emb_rows);
  w.kv_bytes = b.kv_bytes;
  w.emb_bytes = b.emb_bytes;
  w.alpha_target = b.alpha_target;
  w.alpha_effective = b.alpha_effective;
  w.refill_bytes = Delta(b.refill_bytes, a.refill_bytes);
  w.refill_backlog_rows = b.refill_backlog_rows;
  w.miss_bytes = Delta(b.miss_bytes, a.miss_bytes);
  const int64_t window_ns = absl::ToInt64Nanoseconds(w.duration);
  w.link_utilisation =
      window_ns <= 0 ? 0.0
                     : std::min(1.0, static_cast<double>(Delta(b.link_busy_ns, a.link_busy_ns)) /
                                         static_cast<double>(window_ns));
  last_ = sample;
  windows_.push_back(w);
  while (windows_.size() > keep_) windows_.pop_front();
  return w;
}

std::vector<MemoryWindow> WindowAggregator::Recent() const {
  absl::MutexLock lock(&mu_);
  return std::vector<MemoryWindow>(windows_.begin(), windows_.end());
}

}  // namespace hlem::serving
