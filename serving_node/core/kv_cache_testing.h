#pragma once
// Tests only: the small KV cache geometry and token helpers shared by the KV cache tests.

#include <cstdint>
#include <span>
#include <vector>

#include "common/rng.h"
#include "gtest/gtest.h"
#include "serving_node/core/kv_cache.h"
#include "serving_node/core/residency_events.h"

namespace hlem::serving::kv_testing {

// 2 layers × 2 (K, V) × kv_dim 4 × 1 byte = 16 bytes a token: a 256-byte page holds 16 tokens.
constexpr uint64_t kPageBytes = 256;
constexpr uint32_t kPt = 16;

inline KvCacheOptions SmallOptions() {
  KvCacheOptions o;
  o.layers = 2;
  o.kv_dim = 4;
  o.dtype_bytes = 1;
  return o;
}

inline std::vector<uint64_t> Tokens(uint64_t seed, size_t n) {
  std::vector<uint64_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = KeyedHash(seed, i);
  return t;
}

inline std::span<const uint64_t> Prefix(const std::vector<uint64_t>& v, size_t n) {
  return std::span<const uint64_t>(v).first(n);
}

inline std::vector<ResidencyEvent> EventsFrom(const ResidencyEventLog& log, uint64_t from_seq) {
  absl::StatusOr<std::vector<ResidencyEvent>> events = log.Since(from_seq);
  EXPECT_TRUE(events.ok()) << events.status();
  return events.ok() ? *std::move(events) : std::vector<ResidencyEvent>{};
}

}  // namespace hlem::serving::kv_testing
