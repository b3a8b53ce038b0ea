#include "embedding_shard/core/shard_map.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace hlem::shard {

absl::string_view PartitioningName(Partitioning p) {
  return p == Partitioning::kRange ? "range" : "hash";
}

absl::StatusOr<ShardMap> ShardMap::Create(const ShardMapOptions& options) {
  if (options.num_shards < 1 || options.num_shards > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_map.num_shards: must be in [1, 4096], got ", options.num_shards));
  }
  if (options.replicas < 1 || options.replicas > options.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard_map.replicas: must be in [1, ",
                                                   options.num_shards, "] (num_shards), got ",
                                                   options.replicas));
  }
  return ShardMap(options);
}

TableLayout ShardMap::Layout(const TableSpec& spec) const {
  TableLayout layout;
  layout.hash_ = options_.partitioning == Partitioning::kHash && spec.rows > 1;
  layout.rows_ = spec.rows;
  layout.slots_per_partition_ =
      std::max<uint64_t>(1, (spec.rows + options_.num_shards - 1) / options_.num_shards);
  if (layout.hash_) {
    const int bits = std::bit_width(spec.rows - 1);
    layout.half_bits_ = (bits + 1) / 2;
    layout.mask_ = (uint64_t{1} << layout.half_bits_) - 1;
    const uint64_t base = KeyedHash(options_.hash_seed, spec.id);
    for (int i = 0; i < TableLayout::kRounds; ++i) {
      layout.keys_[i] = base + (i + 1) * 0x9e3779b97f4a7c15ULL;
    }
  }
  return layout;
}

// A balanced Feistel network over 2h bits (4^h >= rows) with cycle walking: a keyed bijection on
// [0, rows) whose inverse is as cheap as the forward direction. Each walk step leaves the domain
// with probability < 3/4, so the expected number of steps is below 4.
uint64_t TableLayout::Permute(uint64_t x, bool inverse) const {
  do {
    uint64_t l = x >> half_bits_, r = x & mask_;
    if (!inverse) {
      for (int i = 0; i < kRounds; ++i) {
        uint64_t f = Mix64(r ^ keys_[i]) & mask_;
        uint64_t nl = r;
        r = l ^ f;
        l = nl;
      }
    } else {
      for (int i = kRounds - 1; i >= 0; --i) {
        uint64_t f = Mix64(l ^ keys_[i]) & mask_;
        uint64_t nr = l;
        l = r ^ f;
        r = nr;
      }
    }
    x = (l << half_bits_) | r;
  } while (x >= rows_);
  return x;
}

uint64_t ShardMap::SlotOfRow(const TableSpec& spec, uint64_t row) const {
  return Layout(spec).SlotOfRow(row);
}

uint64_t ShardMap::RowOfSlot(const TableSpec& spec, uint64_t slot) const {
  return Layout(spec).RowOfSlot(slot);
}

uint64_t ShardMap::SlotsPerPartition(const TableSpec& spec) const {
  return Layout(spec).slots_per_partition();
}

uint32_t ShardMap::PartitionOfSlot(const TableSpec& spec, uint64_t slot) const {
  return Layout(spec).PartitionOfSlot(slot);
}

SlotRange ShardMap::PartitionSlots(const TableSpec& spec, uint32_t partition) const {
  const uint64_t per = SlotsPerPartition(spec);
  const uint64_t first = std::min<uint64_t>(spec.rows, per * partition);
  const uint64_t end = std::min<uint64_t>(spec.rows, first + per);
  return SlotRange{first, end - first};
}

std::vector<uint32_t> ShardMap::ServersOf(uint32_t partition) const {
  std::vector<uint32_t> servers;
  servers.reserve(options_.replicas);
  for (uint32_t r = 0; r < options_.replicas; ++r) {
    servers.push_back((partition + r) % options_.num_shards);
  }
  return servers;
}

std::vector<uint32_t> ShardMap::PartitionsOn(uint32_t server) const {
  std::vector<uint32_t> partitions;
  for (uint32_t p = 0; p < options_.num_shards; ++p) {
    uint32_t distance = (server + options_.num_shards - p) % options_.num_shards;
    if (distance < options_.replicas) partitions.push_back(p);
  }
  return partitions;
}

}  // namespace hlem::shard
