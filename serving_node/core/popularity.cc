#include "serving_node/core/popularity.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace hlem::serving {

absl::StatusOr<std::unique_ptr<PopularitySketch>> PopularitySketch::Create(
    const PopularityOptions& options) {
  if (options.capacity == 0) return absl::InvalidArgumentError("popularity.capacity: must be > 0");
  if (options.sample_one_in == 0) {
    return absl::InvalidArgumentError("popularity.sample_one_in: must be > 0");
  }
  if (!(options.decay_factor > 0 && options.decay_factor <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("popularity.decay_factor: must be in (0, 1], got ", options.decay_factor));
  }
  return std::unique_ptr<PopularitySketch>(new PopularitySketch(options));
}

PopularitySketch::PopularitySketch(const PopularityOptions& options)
    : options_(options),
      decay_every_(options.decay_every_samples != 0 ? options.decay_every_samples
                                                    : uint64_t{8} * options.capacity) {
  heap_.reserve(options.capacity);
  pos_.reserve(options.capacity);
}

bool PopularitySketch::Sampled() {
  const uint64_t n = accesses_.fetch_add(1, std::memory_order_relaxed);
  return options_.sample_one_in == 1 || KeyedHash(options_.seed, n) % options_.sample_one_in == 0;
}

void PopularitySketch::Record(uint32_t table_id, uint64_t row) {
  if (!Sampled()) return;
  absl::MutexLock lock(&mu_);
  CountLocked(table_id, row);
}

void PopularitySketch::RecordBatch(uint32_t table_id, std::span<const uint64_t> rows) {
  // Decide the samples first so the lock is taken at most once, and not at all for most batches.
  uint64_t picked[64];
  size_t i = 0;
  while (i < rows.size()) {
    size_t n = 0;
    for (; i < rows.size() && n < 64; ++i) {
      if (Sampled()) picked[n++] = rows[i];
    }
    if (n == 0) continue;
    absl::MutexLock lock(&mu_);
    for (size_t j = 0; j < n; ++j) CountLocked(table_id, picked[j]);
  }
}

void PopularitySketch::CountLocked(uint32_t table_id, uint64_t row) {
  ++samples_;
  if (++since_decay_ >= decay_every_ && options_.decay_factor < 1) {
    // A common factor keeps the heap order; counts of all keys fade together.
    for (Counter& c : heap_) {
      c.count *= options_.decay_factor;
      c.error *= options_.decay_factor;
    }
    since_decay_ = 0;
    ++decays_;
  }
  const Key key{table_id, row};
  if (auto it = pos_.find(key); it != pos_.end()) {
    heap_[it->second].count += 1;
    SiftDownLocked(it->second);
    return;
  }
  if (heap_.size() < options_.capacity) {
    heap_.push_back(Counter{table_id, row, 1, 0});
    pos_[key] = static_cast<uint32_t>(heap_.size() - 1);
    SiftUpLocked(static_cast<uint32_t>(heap_.size() - 1));
    return;
  }
  // Replace the key with the smallest count; the newcomer inherits it as its error.
  Counter& min = heap_[0];
  pos_.erase(Key{min.table_id, min.row});
  min = Counter{table_id, row, min.count + 1, min.count};
  pos_[key] = 0;
  ++replacements_;
  SiftDownLocked(0);
}

void PopularitySketch::SwapLocked(uint32_t a, uint32_t b) {
  std::swap(heap_[a], heap_[b]);
  pos_[Key{heap_[a].table_id, heap_[a].row}] = a;
  pos_[Key{heap_[b].table_id, heap_[b].row}] = b;
}

void PopularitySketch::SiftDownLocked(uint32_t pos) {
  const uint32_t n = static_cast<uint32_t>(heap_.size());
  while (true) {
    uint32_t smallest = pos;
    const uint32_t l = 2 * pos + 1, r = 2 * pos + 2;
    if (l < n && heap_[l].count < heap_[smallest].count) smallest = l;
    if (r < n && heap_[r].count < heap_[smallest].count) smallest = r;
    if (smallest == pos) return;
    SwapLocked(pos, smallest);
    pos = smallest;
  }
}

void PopularitySketch::SiftUpLocked(uint32_t pos) {
  while (pos > 0) {
    const uint32_t parent = (pos - 1) / 2;
    if (heap_[parent].count <= heap_[pos].count) return;
    SwapLocked(pos, parent);
    pos = parent;
  }
}

std::vector<PopularRow> PopularitySketch::TopK(uint32_t k) const {
  std::vector<PopularRow> out;
  {
    absl::MutexLock lock(&mu_);
    out.reserve(heap_.size());
    const double scale = options_.sample_one_in;
    for (const Counter& c : heap_) {
      out.push_back(PopularRow{c.table_id, c.row, c.count * scale, c.error * scale});
    }
  }
  auto hotter = [](const PopularRow& a, const PopularRow& b) {
    return std::tie(b.count, a.table_id, a.row) < std::tie(a.count, b.table_id, b.row);
  };
  const size_t n = std::min<size_t>(k, out.size());
  std::partial_sort(out.begin(), out.begin() + n, out.end(), hotter);
  out.resize(n);
  return out;
}

PopularityStats PopularitySketch::GetStats() const {
  absl::MutexLock lock(&mu_);
  return PopularityStats{.accesses = accesses_.load(std::memory_order_relaxed),
                         .samples = samples_,
                         .replacements = replacements_,
                         .decays = decays_,
                         .tracked = static_cast<uint32_t>(heap_.size())};
}

}  // namespace hlem::serving
