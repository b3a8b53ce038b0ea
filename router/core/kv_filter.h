#pragma once
// The router's per-node KV residency set (ARCHITECTURE §6, KVM[n]): which users' K/V a node holds,
// in about 2 bytes per user. A cuckoo filter (Fan et al., 2014) of 16-bit fingerprints in buckets
// of four: Insert, Erase and Contains are O(1); a user that was inserted is always found (no false
// negatives as long as only inserted users are erased); a user that was not is found with
// probability about 8 / 65536 ≈ 0.012 % (a false positive costs one stale KV hit: the node
// recomputes, never serves wrong scores). The residency events are exact, so the router only
// erases what it inserted; a user stored twice is inserted once (the filter is a set: Insert of a
// present fingerprint does nothing).
//
// Capacity is fixed at construction (rounded up to a power of two of buckets). Insert fails when
// the filter is too full (≈ 95 % of capacity); the caller then rebuilds a larger filter from the
// node's snapshot (the exact user list) — fingerprints alone cannot be rehashed. Not thread-safe.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hlem::router {

class KvFilter {
 public:
  // Room for at least `capacity` users (at ≈ 95 % occupancy).
  explicit KvFilter(size_t capacity);

  // False when the user could not be placed (the filter is full); nothing changed then.
  bool Insert(uint64_t user);
  // True when a fingerprint of the user was removed.
  bool Erase(uint64_t user);
  bool Contains(uint64_t user) const;
  // The hashing of Contains, done once for probing many filters with one user.
  struct Probe {
    uint64_t hash;    // bucket bits
    uint64_t offset;  // alternate-bucket offset (a function of the fingerprint)
    uint16_t fp;
  };
  static Probe ProbeOf(uint64_t user);
  bool Contains(const Probe& probe) const;
  void Clear();

  size_t size() const { return size_; }
  size_t capacity() const { return slots_.size(); }  // slots; usable ≈ 95 %
  size_t bytes() const { return slots_.size() * sizeof(uint16_t); }

 private:
  static constexpr int kWays = 4;
  static constexpr int kMaxKicks = 500;
  struct Place {
    size_t b1, b2;
    uint16_t fp;
  };
  Place PlaceOf(const Probe& probe) const;
  size_t Alt(size_t bucket, uint16_t fp) const;
  bool Has(size_t bucket, uint16_t fp) const;
  bool Put(size_t bucket, uint16_t fp);

  size_t mask_ = 0;              // buckets - 1
  std::vector<uint16_t> slots_;  // buckets × kWays; 0 = empty
  size_t size_ = 0;
  uint64_t kick_state_ = 0x9e3779b97f4a7c15ULL;  // deterministic victim choice
};

}  // namespace hlem::router
