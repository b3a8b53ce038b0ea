#include "embedding_shard/core/shard_store.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "embedding_shard/core/table_file.h"

namespace hlem::shard {
namespace {

class HeapRegion final : public Region {
 public:
  explicit HeapRegion(size_t bytes)
      : data_(static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))),
        size_(bytes) {}
  ~HeapRegion() override { std::free(data_); }
  std::byte* data() const override { return data_; }
  size_t size() const override { return size_; }
  bool ok() const { return data_ != nullptr; }

 private:
  std::byte* data_;
  size_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Region>> HeapAllocator::Allocate(size_t bytes) {
  auto region = std::make_unique<HeapRegion>(std::max<size_t>(bytes, 64));
  if (!region->ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return region;
}

absl::StatusOr<std::unique_ptr<ShardStore>> ShardStore::Create(const ShardStoreOptions& options,
                                                               RegionAllocator& allocator) {
  ASSIGN_OR_RETURN(ShardMap map, ShardMap::Create(options.map));
  if (options.server_index >= map.num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat("shard index ", options.server_index,
                                                   " must be < num_shards ", map.num_shards()));
  }
  if (options.tables.empty()) return absl::InvalidArgumentError("tables: at least one required");
  std::unique_ptr<ShardStore> store(new ShardStore(options, std::move(map)));
  for (size_t t = 0; t < options.tables.size(); ++t) {
    const TableSpec& spec = options.tables[t];
    if (!store->table_index_.emplace(spec.id, t).second) {
      return absl::InvalidArgumentError(absl::StrCat("tables[", t, "].id: duplicate id ", spec.id));
    }
    for (uint32_t partition : store->map_.PartitionsOn(options.server_index)) {
      Segment segment;
      segment.table_id = spec.id;
      segment.partition = partition;
      segment.slots = store->map_.PartitionSlots(spec, partition);
      segment.row_bytes = spec.row_bytes();
      ASSIGN_OR_RETURN(segment.region, allocator.Allocate(segment.slots.count * spec.row_bytes()));
      store->segments_.push_back(std::move(segment));
    }
  }
  // segments_ is complete: pointers into it stay valid from here on.
  store->segment_of_partition_.assign(options.tables.size(),
                                      std::vector<const Segment*>(store->map_.num_shards()));
  for (const Segment& segment : store->segments_) {
    size_t t = store->table_index_[segment.table_id];
    store->segment_of_partition_[t][segment.partition] = &segment;
  }
  if (options.content.kind == ContentSource::Kind::kGenerated) {
    for (Segment& segment : store->segments_) {
      const TableSpec& spec = *store->FindTable(segment.table_id);
      const TableLayout layout = store->map_.Layout(spec);
      for (uint64_t i = 0; i < segment.slots.count; ++i) {
        uint64_t slot = segment.slots.first + i;
        GenerateRow(options.content.seed, spec, layout.RowOfSlot(slot), segment.RowAt(slot));
      }
    }
  } else {
    for (const TableSpec& spec : options.tables) {
      std::string path = absl::StrCat(options.content.dir, "/", spec.name, ".hlemtbl");
      // With &spec the file's rows have the config's row size, or nothing is read.
      auto header = ReadTableFile(
          path,
          [&](uint64_t row, const std::byte* bytes) {
            std::byte* dst = const_cast<std::byte*>(store->RowPointer(spec, row));
            if (dst != nullptr) std::memcpy(dst, bytes, spec.row_bytes());
          },
          &spec);
      if (!header.ok()) return header.status();
    }
  }
  return store;
}

const TableSpec* ShardStore::FindTable(uint32_t table_id) const {
  auto it = table_index_.find(table_id);
  return it == table_index_.end() ? nullptr : &options_.tables[it->second];
}

const std::byte* ShardStore::RowPointer(const TableSpec& spec, uint64_t row) const {
  auto t = table_index_.find(spec.id);
  if (t == table_index_.end()) return nullptr;
  const TableLayout layout = map_.Layout(spec);
  uint64_t slot = layout.SlotOfRow(row);
  const Segment* segment = segment_of_partition_[t->second][layout.PartitionOfSlot(slot)];
  return segment == nullptr ? nullptr : segment->RowAt(slot);
}

absl::Status ShardStore::ValidateBatch(uint32_t table_id, std::span<const uint64_t> rows) const {
  return Visit(table_id, rows, [](size_t, const std::byte*) {});
}

absl::Status ShardStore::Gather(uint32_t table_id, std::span<const uint64_t> rows,
                                std::span<std::byte> out) const {
  const TableSpec* spec = FindTable(table_id);
  if (spec != nullptr && out.size() != rows.size() * spec->row_bytes()) {
    return absl::InternalError("Gather: output size does not match the batch");
  }
  const size_t row_bytes = spec != nullptr ? spec->row_bytes() : 0;
  return Visit(table_id, rows, [&](size_t i, const std::byte* row) {
    std::memcpy(out.data() + i * row_bytes, row, row_bytes);
  });
}

absl::Status ShardStore::CheckBatchSize(uint64_t rows) const {
  if (rows == 0) return absl::InvalidArgumentError("row_ids: empty batch");
  if (rows > options_.max_batch_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "row_ids: batch of ", rows, " rows over the limit of ", options_.max_batch_rows));
  }
  return absl::OkStatus();
}

absl::Status ShardStore::Visit(uint32_t table_id, std::span<const uint64_t> rows,
                               const std::function<void(size_t, const std::byte*)>& fn) const {
  const TableSpec* spec = FindTable(table_id);
  if (spec == nullptr) {
    std::vector<uint32_t> ids;
    for (const TableSpec& t : options_.tables) ids.push_back(t.id);
    return absl::InvalidArgumentError(
        absl::StrCat("table_id ", table_id, " is unknown; tables: ", absl::StrJoin(ids, ",")));
  }
  if (absl::Status st = CheckBatchSize(rows.size()); !st.ok()) return st;
  const TableLayout layout = map_.Layout(*spec);
  const std::vector<const Segment*>& segments = segment_of_partition_[table_index_.at(table_id)];
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= spec->rows) {
      return absl::OutOfRangeError(absl::StrCat("row_ids[", i, "] = ", rows[i],
                                                " out of range for table ", table_id, " with ",
                                                spec->rows, " rows"));
    }
    const uint64_t slot = layout.SlotOfRow(rows[i]);
    const Segment* segment = segments[layout.PartitionOfSlot(slot)];
    const std::byte* row = segment == nullptr ? nullptr : segment->RowAt(slot);
    if (row == nullptr) {
      return absl::OutOfRangeError(
          absl::StrCat("row_ids[", i, "] = ", rows[i], " of table ", table_id,
                       " is not held by shard ", options_.server_index, " (partition ",
                       map_.PartitionOfSlot(*spec, map_.SlotOfRow(*spec, rows[i])), ")"));
    }
    fn(i, row);
  }
  return absl::OkStatus();
}

uint64_t ShardStore::resident_bytes() const {
  uint64_t total = 0;
  for (const Segment& s : segments_) total += s.region->size();
  return total;
}

}  // namespace hlem::shard
