#pragma once
// Where Device::SumRows reads a row (standard library only: the standalone CUDA build includes it).

#include <cstdint>

namespace hlem::serving {

// A row source is a byte offset into the pool, or, with this bit set, a byte offset into the
// SumRows call's `extra` buffer (rows a request uses without caching them).
inline constexpr uint64_t kRowInBuffer = uint64_t{1} << 63;
inline constexpr uint64_t RowInBuffer(uint64_t offset) { return offset | kRowInBuffer; }

}  // namespace hlem::serving
