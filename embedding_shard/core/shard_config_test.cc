#include "embedding_shard/core/shard_config.h"

#include <yaml-cpp/yaml.h>

#include "common/config.h"
#include "gtest/gtest.h"

namespace hlem::shard {
namespace {

absl::StatusOr<ShardClusterConfig> Parse(const std::string& text) {
  auto node = ParseYaml(text);
  if (!node.ok()) return node.status();
  return ParseShardClusterConfig(*node);
}

constexpr char kGood[] = R"(
shard_map: {num_shards: 2, partitioning: hash, replicas: 2, hash_seed: 9}
tables:
  - {id: 0, name: item, rows: 1000, dim: 64, dtype: fp32}
  - {id: 1, name: category, rows: 50, dim: 64, dtype: bf16}
content: {source: generated, seed: 5}
limits: {max_batch_rows: 4096}
servers: ["127.0.0.1:1", "127.0.0.1:2"]
ucx: {transports: shm, gather_min_rows_shm: 32, progress_spin: 100us}
)";

TEST(ShardConfigTest, ParsesEverything) {
  auto c = Parse(kGood);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->map.num_shards, 2u);
  EXPECT_EQ(c->map.partitioning, Partitioning::kHash);
  EXPECT_EQ(c->map.replicas, 2u);
  EXPECT_EQ(c->map.hash_seed, 9u);
  ASSERT_EQ(c->tables.size(), 2u);
  EXPECT_EQ(c->tables[1].dtype, Dtype::kBf16);
  EXPECT_EQ(c->tables[1].row_bytes(), 128u);
  EXPECT_EQ(c->content.seed, 5u);
  EXPECT_EQ(c->max_batch_rows, 4096u);
  EXPECT_EQ(c->servers.size(), 2u);
  EXPECT_EQ(c->ucx.transports, "shm");
  EXPECT_EQ(c->ucx.gather_min_rows_shm, 32u);
  EXPECT_EQ(c->ucx.progress_spin, absl::Microseconds(100));
  EXPECT_EQ(StoreOptionsFor(*c, 1).server_index, 1u);
  EXPECT_EQ(ClientOptionsFor(*c).max_batch_rows, 4096u);
}

void ExpectError(const std::string& text, const std::string& fragment) {
  auto c = Parse(text);
  ASSERT_FALSE(c.ok()) << text;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(fragment), std::string_view::npos)
      << c.status().message() << "\n  should mention: " << fragment;
}

TEST(ShardConfigTest, ErrorsNameTheField) {
  ExpectError("tables: [{id: 0, name: a, rows: 1, dim: 1}]", "shard_map");
  ExpectError("shard_map: {num_shards: 0}\ntables: [{id: 0, name: a, rows: 1, dim: 1}]",
              "shard_map.num_shards");
  ExpectError(
      "shard_map: {num_shards: 2, replicas: 3}\ntables: [{id: 0, name: a, rows: 1, dim: 1}]",
      "shard_map.replicas");
  ExpectError("shard_map: {num_shards: 1}\ntables: [{id: 0, name: a, rows: 0, dim: 1}]",
              "tables[0].rows");
  ExpectError(
      "shard_map: {num_shards: 1}\ntables: [{id: 0, name: a, rows: 1, dim: 1, dtype: int8}]",
      "tables[0].dtype");
  ExpectError(
      "shard_map: {num_shards: 1}\ntables: [{id: 0, name: a, rows: 1, dim: 1}, {id: 0, name: b, "
      "rows: 1, dim: 1}]",
      "tables[1].id");
  ExpectError("shard_map: {num_shards: 1}\ntables: [{id: 0, name: a/b, rows: 1, dim: 1}]",
              "tables[0].name");
  ExpectError("shard_map: {num_shards: 1}\ntables: []\n", "tables");
  ExpectError(
      "shard_map: {num_shards: 2}\ntables: [{id: 0, name: a, rows: 1, dim: 1}]\n"
      "servers: [a:1]",
      "servers");
  ExpectError(
      "shard_map: {num_shards: 1}\ntables: [{id: 0, name: a, rows: 1, dim: 1}]\n"
      "content: {source: file}",
      "content.dir");
  ExpectError(
      "shard_map: {num_shards: 1}\ntables: [{id: 0, name: a, rows: 1, dim: 1}]\n"
      "limits: {max_batch_rows: -3}",
      "limits.max_batch_rows");
  // 65536 rows of 4 KiB (the default limit) are 256 MiB: more than a reply may hold.
  ExpectError("shard_map: {num_shards: 1}\ntables: [{id: 0, name: a, rows: 1, dim: 1024}]",
              "limits.max_batch_rows");
  EXPECT_TRUE(Parse("shard_map: {num_shards: 1}\ntables: [{id: 0, name: a, rows: 1, dim: 1024}]\n"
                    "limits: {max_batch_rows: 1024}")
                  .ok());
  ExpectError(
      "shard_map: {num_shards: 1}\ntables: [{id: 0, name: a, rows: 1, dim: 1}]\n"
      "shards: 3",
      "shards");
}

}  // namespace
}  // namespace hlem::shard
