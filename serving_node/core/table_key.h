#pragma once
// A (table id, id) pair as a hash-map key: a row of a table, or a residency shard of a table.
// Shared by the EMB cache, the popularity sketch and the residency tracker.

#include <cstdint>
#include <utility>

namespace hlem::serving {

struct TableKey {
  uint32_t table_id = 0;
  uint64_t id = 0;  // a row id, or a residency shard id
  bool operator==(const TableKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const TableKey& k) {
    return H::combine(std::move(h), k.table_id, k.id);
  }
};

}  // namespace hlem::serving
