#include "embedding_shard/core/shard_map.h"

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

// A balanced Feistel network over 2h bits (4^h >= rows) with cycle walking: a keyed bijection on
// [0, rows) whose inverse is as cheap as the forward direction. Each walk step leaves the domain
// with probability < 3/4, so the expected number of steps is below 4.
uint64_t ShardMap::Permute(const TableSpec& spec, uint64_t x, bool inverse) const {
  const uint64_t n = spec.rows;
  if (n <= 1) return x;
  const int bits = std::bit_width(n - 1);
  const int half = (bits + 1) / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  constexpr int kRounds = 4;
  uint64_t keys[kRounds];
  const uint64_t base = KeyedHash(options_.hash_seed, spec.id);
  for (int i = 0; i < kRounds; ++i) keys[i] = base + (i + 1) * 0x9e3779b97f4a7c15ULL;
  do {
    uint64_t l = x >> half, r = x & mask;
    if (!inverse) {
      for (int i = 0; i < kRounds; ++i) {
        uint64_t f = Mix64(r ^ keys[i]) & mask;
        uint64_t nl = r;
        r = l ^ f;
        l = nl;
      }
    } else {
      for (int i = kRounds - 1; i >= 0; --i) {
        uint64_t f = Mix64(l ^ keys[i]) & mask;
        uint64_t nr = l;
        l = r ^ f;
        r = nr;
      }
    }
    x = (l << half) | r;
  } while (x >= n);
  return x;
}

uint64_t ShardMap::SlotOfRow(const TableSpec& spec, uint64_t row) const {
  return options_.partitioning == Partitioning::kRange ? row : Permute(spec, row, false);
}

uint64_t ShardMap::RowOfSlot(const TableSpec& spec, uint64_t slot) const {
  return options_.partitioning == Partitioning::kRange ? slot : Permute(spec, slot, true);
}

uint64_t ShardMap::SlotsPerPartition(const TableSpec& spec) const {
  return (spec.rows + options_.num_shards - 1) / options_.num_shards;
}

uint32_t ShardMap::PartitionOfSlot(const TableSpec& spec, uint64_t slot) const {
  return static_cast<uint32_t>(slot / SlotsPerPartition(spec));
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
