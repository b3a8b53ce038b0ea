#include "embedding_shard/core/shard_store.h"

#include <cstring>
#include <vector>

#include "embedding_shard/core/table_file.h"
#include "gtest/gtest.h"

namespace hlem::shard {
namespace {

ShardStoreOptions Options(uint32_t server, Partitioning p = Partitioning::kHash) {
  ShardStoreOptions o;
  o.tables = {TableSpec{.id = 0, .name = "item", .rows = 1000, .dim = 8, .dtype = Dtype::kFp32},
              TableSpec{.id = 7, .name = "cat", .rows = 37, .dim = 16, .dtype = Dtype::kFp16}};
  o.map = {.num_shards = 3, .partitioning = p, .replicas = 2};
  o.server_index = server;
  o.content.seed = 11;
  o.max_batch_rows = 100;
  return o;
}

std::vector<std::byte> Expected(const ShardStoreOptions& o, const TableSpec& spec,
                                std::span<const uint64_t> rows) {
  std::vector<std::byte> out(rows.size() * spec.row_bytes());
  for (size_t i = 0; i < rows.size(); ++i) {
    GenerateRow(o.content.seed, spec, rows[i], out.data() + i * spec.row_bytes());
  }
  return out;
}

TEST(ShardStoreTest, HoldsExactlyItsPartitionsWithGeneratedContent) {
  HeapAllocator heap;
  for (Partitioning p : {Partitioning::kRange, Partitioning::kHash}) {
    for (uint32_t server = 0; server < 3; ++server) {
      auto o = Options(server, p);
      auto store = ShardStore::Create(o, heap);
      ASSERT_TRUE(store.ok()) << store.status();
      EXPECT_EQ((*store)->segments().size(), 4u);  // 2 tables x 2 partitions
      for (const TableSpec& spec : o.tables) {
        size_t held = 0;
        for (uint64_t r = 0; r < spec.rows; ++r) {
          const std::byte* row = (*store)->RowPointer(spec, r);
          if (row == nullptr) continue;
          ++held;
          std::vector<std::byte> expected(spec.row_bytes());
          GenerateRow(o.content.seed, spec, r, expected.data());
          ASSERT_EQ(std::memcmp(row, expected.data(), spec.row_bytes()), 0);
        }
        // 2 of 3 partitions, of ceil(rows/3) slots each (the last may be short).
        EXPECT_GE(held, spec.rows / 2);
        EXPECT_LT(held, spec.rows);
      }
    }
  }
}

TEST(ShardStoreTest, GatherReturnsRowsInRequestOrder) {
  HeapAllocator heap;
  auto o = Options(0, Partitioning::kRange);
  auto store = *ShardStore::Create(o, heap);
  const TableSpec& spec = o.tables[0];
  std::vector<uint64_t> rows = {5, 0, 300, 5, 700};  // partitions 0 and 2 are on server 0
  std::vector<std::byte> out(rows.size() * spec.row_bytes());
  ASSERT_TRUE(store->Gather(0, rows, out).ok());
  EXPECT_EQ(out, Expected(o, spec, rows));
}

TEST(ShardStoreTest, BadBatchesGetClearErrors) {
  HeapAllocator heap;
  auto o = Options(0, Partitioning::kRange);
  auto store = *ShardStore::Create(o, heap);
  std::vector<uint64_t> ok = {1};
  auto unknown = store->ValidateBatch(3, ok);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("tables: 0,7"), std::string_view::npos);
  EXPECT_EQ(store->ValidateBatch(0, {}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<uint64_t> big(101, 1);
  EXPECT_EQ(store->ValidateBatch(0, big).code(), absl::StatusCode::kResourceExhausted);
  std::vector<uint64_t> out_of_range = {1, 1000};
  auto oor = store->ValidateBatch(0, out_of_range);
  EXPECT_EQ(oor.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(oor.message().find("row_ids[1] = 1000"), std::string_view::npos);
  std::vector<uint64_t> elsewhere = {400};  // partition 1: servers 1 and 2
  auto not_here = store->ValidateBatch(0, elsewhere);
  EXPECT_EQ(not_here.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(not_here.message().find("not held by shard 0"), std::string_view::npos);
  std::vector<std::byte> wrong_size(3);
  EXPECT_EQ(store->Gather(0, ok, wrong_size).code(), absl::StatusCode::kInternal);
}

TEST(ShardStoreTest, LoadsFromTableFiles) {
  HeapAllocator heap;
  auto o = Options(1);
  std::string dir = ::testing::TempDir();
  for (const TableSpec& spec : o.tables) {
    ASSERT_TRUE(
        WriteTableFile(dir + "/" + spec.name + ".hlemtbl", spec, [&](uint64_t r, std::byte* out) {
          GenerateRow(o.content.seed, spec, r, out);
        }).ok());
  }
  o.content.kind = ContentSource::Kind::kFile;
  o.content.dir = dir;
  auto store = ShardStore::Create(o, heap);
  ASSERT_TRUE(store.ok()) << store.status();
  const TableSpec& spec = o.tables[1];
  std::vector<uint64_t> rows;
  for (uint64_t r = 0; r < spec.rows; ++r) {
    if ((*store)->RowPointer(spec, r) != nullptr) rows.push_back(r);
  }
  std::vector<std::byte> out(rows.size() * spec.row_bytes());
  ASSERT_TRUE((*store)->Gather(7, rows, out).ok());
  EXPECT_EQ(out, Expected(o, spec, rows));

  // A config that disagrees with the file is refused, naming both.
  o.tables[1].dim = 8;
  auto mismatch = ShardStore::Create(o, heap);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("config says"), std::string_view::npos);
}

TEST(ShardStoreTest, RejectsBadOptions) {
  HeapAllocator heap;
  auto o = Options(3);
  EXPECT_FALSE(ShardStore::Create(o, heap).ok());
  o = Options(0);
  o.tables[1].id = 0;
  auto dup = ShardStore::Create(o, heap);
  EXPECT_NE(dup.status().message().find("duplicate"), std::string_view::npos);
}

}  // namespace
}  // namespace hlem::shard
