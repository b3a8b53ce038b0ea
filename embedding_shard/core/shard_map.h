#pragma once
// Where each embedding row lives. Shared by shard servers and clients, built from the same config.
//
// Every table's rows are first mapped to "slots" in [0, rows): the identity for `range`
// partitioning, a keyed pseudo-random permutation for `hash` partitioning (so hot row ranges spread
// over all shards, yet a client can still compute a row's exact remote address). Slots are then
// cut into `num_shards` contiguous partitions of ceil(rows / num_shards) slots. Partition p is held
// by servers p, p+1, ..., p+replicas-1 (mod num_shards); the first is its primary. A server stores
// each partition it holds as one contiguous segment, row-major in slot order.
//
// Immutable after construction; thread-safe.

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "embedding_shard/core/table.h"

namespace hlem::shard {

enum class Partitioning { kRange, kHash };
absl::string_view PartitioningName(Partitioning p);

struct ShardMapOptions {
  uint32_t num_shards = 1;
  Partitioning partitioning = Partitioning::kRange;
  uint32_t replicas = 1;  // copies of each partition, 1 = no replica
  uint64_t hash_seed = 0x5eed;
};

struct SlotRange {
  uint64_t first = 0;
  uint64_t count = 0;
};

// The placement constants of one table, computed once so the per-row work on hot paths is a few
// multiplies (hash) and one division. Cheap to copy.
class TableLayout {
 public:
  uint64_t SlotOfRow(uint64_t row) const { return hash_ ? Permute(row, false) : row; }
  uint64_t RowOfSlot(uint64_t slot) const { return hash_ ? Permute(slot, true) : slot; }
  uint32_t PartitionOfSlot(uint64_t slot) const {
    return static_cast<uint32_t>(slot / slots_per_partition_);
  }
  uint64_t slots_per_partition() const { return slots_per_partition_; }

 private:
  friend class ShardMap;
  static constexpr int kRounds = 4;
  uint64_t Permute(uint64_t x, bool inverse) const;
  bool hash_ = false;
  uint64_t rows_ = 0;
  uint64_t slots_per_partition_ = 1;
  int half_bits_ = 0;
  uint64_t mask_ = 0;
  uint64_t keys_[kRounds] = {};
};

class ShardMap {
 public:
  static absl::StatusOr<ShardMap> Create(const ShardMapOptions& options);

  const ShardMapOptions& options() const { return options_; }
  uint32_t num_shards() const { return options_.num_shards; }

  TableLayout Layout(const TableSpec& spec) const;

  // Row <-> slot (a bijection on [0, spec.rows)). Each call derives the table's layout; loops
  // over many rows should use Layout().
  uint64_t SlotOfRow(const TableSpec& spec, uint64_t row) const;
  uint64_t RowOfSlot(const TableSpec& spec, uint64_t slot) const;

  uint64_t SlotsPerPartition(const TableSpec& spec) const;
  uint32_t PartitionOfSlot(const TableSpec& spec, uint64_t slot) const;
  SlotRange PartitionSlots(const TableSpec& spec, uint32_t partition) const;

  // Servers holding `partition`, primary first.
  std::vector<uint32_t> ServersOf(uint32_t partition) const;
  // Partitions held by `server`, ascending.
  std::vector<uint32_t> PartitionsOn(uint32_t server) const;

 private:
  explicit ShardMap(const ShardMapOptions& options) : options_(options) {}
  ShardMapOptions options_;
};

}  // namespace hlem::shard
