#include "router/core/kv_filter.h"

#include <algorithm>
#include <bit>

#include "common/rng.h"

namespace hlem::router {

KvFilter::KvFilter(size_t capacity) {
  const size_t buckets =
      std::bit_ceil(std::max<size_t>(1, (capacity * 100 / 95 + kWays - 1) / kWays));
  mask_ = buckets - 1;
  slots_.assign(buckets * kWays, 0);
}

KvFilter::Probe KvFilter::ProbeOf(uint64_t user) {
  const uint64_t h = Mix64(user ^ 0x6b766d3132333435ULL);
  auto fp = static_cast<uint16_t>(h >> 48);
  if (fp == 0) fp = 1;  // 0 marks an empty slot
  return {h, Mix64(fp), fp};
}

KvFilter::Place KvFilter::PlaceOf(const Probe& p) const {
  const size_t b1 = static_cast<size_t>(p.hash) & mask_;
  return {b1, (b1 ^ static_cast<size_t>(p.offset)) & mask_, p.fp};
}

size_t KvFilter::Alt(size_t bucket, uint16_t fp) const {
  return (bucket ^ static_cast<size_t>(Mix64(fp))) & mask_;
}

bool KvFilter::Has(size_t bucket, uint16_t fp) const {
  const uint16_t* b = &slots_[bucket * kWays];
  return b[0] == fp || b[1] == fp || b[2] == fp || b[3] == fp;
}

bool KvFilter::Put(size_t bucket, uint16_t fp) {
  uint16_t* b = &slots_[bucket * kWays];
  for (int i = 0; i < kWays; ++i) {
    if (b[i] == 0) {
      b[i] = fp;
      return true;
    }
  }
  return false;
}

bool KvFilter::Contains(uint64_t user) const { return Contains(ProbeOf(user)); }

bool KvFilter::Contains(const Probe& probe) const {
  const Place p = PlaceOf(probe);
  return Has(p.b1, p.fp) || Has(p.b2, p.fp);
}

bool KvFilter::Insert(uint64_t user) {
  const Place p = PlaceOf(ProbeOf(user));
  if (Has(p.b1, p.fp) || Has(p.b2, p.fp)) return true;
  if (Put(p.b1, p.fp) || Put(p.b2, p.fp)) {
    ++size_;
    return true;
  }
  // Kick fingerprints to their alternate buckets; undo every move if no room turns up.
  struct Move {
    size_t bucket;
    int way;
    uint16_t old;
  };
  std::vector<Move> moves;
  size_t bucket = (kick_state_ & 1) != 0 ? p.b1 : p.b2;
  uint16_t fp = p.fp;
  for (int kick = 0; kick < kMaxKicks; ++kick) {
    kick_state_ = Mix64(kick_state_);
    const int way = static_cast<int>(kick_state_ % kWays);
    uint16_t& slot = slots_[bucket * kWays + static_cast<size_t>(way)];
    moves.push_back({bucket, way, slot});
    std::swap(fp, slot);
    bucket = Alt(bucket, fp);
    if (Put(bucket, fp)) {
      ++size_;
      return true;
    }
  }
  for (auto it = moves.rbegin(); it != moves.rend(); ++it) {
    slots_[it->bucket * kWays + static_cast<size_t>(it->way)] = it->old;
  }
  return false;
}

bool KvFilter::Erase(uint64_t user) {
  const Place p = PlaceOf(ProbeOf(user));
  for (size_t bucket : {p.b1, p.b2}) {
    uint16_t* b = &slots_[bucket * kWays];
    for (int i = 0; i < kWays; ++i) {
      if (b[i] == p.fp) {
        b[i] = 0;
        --size_;
        return true;
      }
    }
  }
  return false;
}

void KvFilter::Clear() {
  std::fill(slots_.begin(), slots_.end(), 0);
  size_ = 0;
}

}  // namespace hlem::router
