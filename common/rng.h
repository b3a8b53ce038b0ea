#pragma once
// Seeded randomness. Code that needs randomness takes an Rng& or a seed; nothing reads
// std::random_device. Keyed helpers give "common random numbers": the same (seed, key...) always
// yields the same value, whatever else the program drew before, so two simulation runs that
// differ in one knob see the same noise.

#include <cstdint>
#include <random>
#include <string_view>

namespace hlem {

using Rng = std::mt19937_64;

// SplitMix64 finaliser: a bijective 64-bit mixer with good avalanche.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A hash of a seed and any number of integer keys; order-sensitive.
// A small, fast generator for hot paths (e.g. tie-breaking): SplitMix64, 8 bytes of state, a
// few cycles per draw (std::mt19937_64 keeps 2.5 KiB and costs ~10 ns). Not for simulations that
// need long, well-studied streams: use Rng there.
class SplitMix64 {
 public:
  using result_type = uint64_t;
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t operator()() {
    const uint64_t r = Mix64(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return r;
  }
  static constexpr uint64_t min() { return 0; }
  static constexpr uint64_t max() { return ~uint64_t{0}; }

 private:
  uint64_t state_;
};

constexpr uint64_t KeyedHash(uint64_t seed) { return Mix64(seed); }
template <typename... Rest>
constexpr uint64_t KeyedHash(uint64_t seed, uint64_t key, Rest... rest) {
  return KeyedHash(Mix64(seed ^ Mix64(key + 0x632be59bd9b4e019ULL)),
                   static_cast<uint64_t>(rest)...);
}

// FNV-1a of a name, for deriving per-component seeds from names ("router", "workload", ...).
constexpr uint64_t NameHash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

// Seed of an independent stream named `name` under `seed`.
constexpr uint64_t DeriveSeed(uint64_t seed, std::string_view name) {
  return KeyedHash(seed, NameHash(name));
}

// A double in [0, 1) from 53 bits of a hash.
constexpr double UnitFromHash(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

}  // namespace hlem
