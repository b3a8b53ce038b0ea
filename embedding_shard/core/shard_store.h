#pragma once
// The rows one shard server holds, and the Lookup logic on them (validation + gather).
//
// Memory comes from a RegionAllocator so the UCX transport can allocate it through ucp_mem_map
// (one-sided reads need UCX-allocated memory; see docs/perf/embedding_shard.md) while tests use the
// heap. Each (table, partition) held by the server is one Segment: a contiguous region of
// `num_slots` rows in slot order. The store is filled once at start-up and read-only after, so
// lookups from many threads need no lock.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "embedding_shard/core/shard_map.h"
#include "embedding_shard/core/table.h"

namespace hlem::shard {

// A block of memory that lives as long as the region object.
class Region {
 public:
  virtual ~Region() = default;
  virtual std::byte* data() const = 0;
  virtual size_t size() const = 0;
};

class RegionAllocator {
 public:
  virtual ~RegionAllocator() = default;
  virtual absl::StatusOr<std::unique_ptr<Region>> Allocate(size_t bytes) = 0;
};

class HeapAllocator final : public RegionAllocator {
 public:
  absl::StatusOr<std::unique_ptr<Region>> Allocate(size_t bytes) override;
};

struct Segment {
  uint32_t table_id = 0;
  uint32_t partition = 0;
  SlotRange slots;
  size_t row_bytes = 0;
  std::unique_ptr<Region> region;

  std::byte* RowAt(uint64_t slot) const {
    return region->data() + (slot - slots.first) * row_bytes;
  }
};

// Where content comes from: generated from a seed, or read from table files (table_file.h).
struct ContentSource {
  enum class Kind { kGenerated, kFile } kind = Kind::kGenerated;
  uint64_t seed = 42;
  std::string dir;  // kFile: directory holding "<table name>.hlemtbl"
};

struct ShardStoreOptions {
  std::vector<TableSpec> tables;
  ShardMapOptions map;
  uint32_t server_index = 0;
  ContentSource content;
  uint32_t max_batch_rows = 65536;
};

class ShardStore {
 public:
  // Allocates and fills every segment the server holds. Errors name the offending field or file.
  static absl::StatusOr<std::unique_ptr<ShardStore>> Create(const ShardStoreOptions& options,
                                                            RegionAllocator& allocator);

  const ShardStoreOptions& options() const { return options_; }
  const ShardMap& map() const { return map_; }
  const std::vector<Segment>& segments() const { return segments_; }
  const TableSpec* FindTable(uint32_t table_id) const;

  // Checks a batch: known table, 1..max_batch_rows rows, every row < rows and held here.
  // INVALID_ARGUMENT (unknown table, empty), OUT_OF_RANGE (row >= rows, or not held here),
  // RESOURCE_EXHAUSTED (more than max_batch_rows).
  absl::Status ValidateBatch(uint32_t table_id, std::span<const uint64_t> rows) const;
  // The size part of it alone: a transport checks a declared count before it allocates.
  absl::Status CheckBatchSize(uint64_t rows) const;
  // Validates, then copies the rows into out in request order (out.size() == rows * row_bytes).
  absl::Status Gather(uint32_t table_id, std::span<const uint64_t> rows,
                      std::span<std::byte> out) const;
  // The stored row, or nullptr when the row is not held here. `rows` must be < spec.rows.
  const std::byte* RowPointer(const TableSpec& spec, uint64_t row) const;

  uint64_t resident_bytes() const;

 private:
  ShardStore(const ShardStoreOptions& options, ShardMap map)
      : options_(options), map_(std::move(map)) {}
  // Checks the batch and calls fn(i, row bytes) for each row in order; stops at the first error
  // (fn may then have seen a prefix of the batch).
  absl::Status Visit(uint32_t table_id, std::span<const uint64_t> rows,
                     const std::function<void(size_t, const std::byte*)>& fn) const;

  ShardStoreOptions options_;
  ShardMap map_;
  std::vector<Segment> segments_;
  // Per table (same order as options_.tables): partition -> segment, null when not held here.
  std::vector<std::vector<const Segment*>> segment_of_partition_;
  absl::flat_hash_map<uint32_t, size_t> table_index_;
};

}  // namespace hlem::shard
