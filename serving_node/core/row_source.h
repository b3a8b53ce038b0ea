#pragma once
// Where the serving node gets embedding rows it does not hold: the shard client in production,
// a fake in tests and in the simulator. Refill (refill.h) fetches through it.

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace hlem::serving {

class RowSource {
 public:
  virtual ~RowSource() = default;
  // Writes the bytes of rows[i] of `table_id` to out[i * row_bytes, (i + 1) * row_bytes), where
  // row_bytes = out.size() / rows.size(). Blocks until done or `deadline` (DEADLINE_EXCEEDED);
  // other failures as the shard reports them (UNAVAILABLE, NOT_FOUND, ...). On an error `out`
  // holds nothing usable. Implementations are thread-safe.
  virtual absl::Status Fetch(uint32_t table_id, std::span<const uint64_t> rows,
                             std::span<std::byte> out, absl::Time deadline) = 0;
};

}  // namespace hlem::serving
