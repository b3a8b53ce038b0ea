#include "serving_node/service/node_config.h"

#include <fstream>
#include <string>

#include "common/config.h"
#include "gtest/gtest.h"
#include "serving_node/core/residency_events.h"

namespace hlem::serving {
namespace {

TEST(NodeConfigTest, TheLocalProfileParses) {
  auto c = LoadNodeConfig(std::string(HLEM_SOURCE_DIR) + "/deploy/local/node.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node.node_id, "node-0");
  EXPECT_EQ(c->node.slo, absl::Milliseconds(25));  // calibrated: docs/calibration.md
  EXPECT_EQ(c->pool_bytes, 64ull << 20);
  EXPECT_EQ(c->link.bytes_per_second, 3.2e6);
  EXPECT_EQ(c->features.size(), 2u);
  EXPECT_EQ(c->shards.tables.size(), 3u);
  EXPECT_EQ(c->model.dim, 64u);
  EXPECT_EQ(c->max_history, 512u);
  EXPECT_EQ(c->queue.max_batch, 16u);
}

// Writes a node config next to the local shard config and parses it.
absl::StatusOr<NodeConfig> Parse(const std::string& yaml) {
  auto root = ParseYaml(yaml);
  if (!root.ok()) return root.status();
  return ParseNodeConfig(*root, std::string(HLEM_SOURCE_DIR) + "/deploy/local");
}

constexpr char kMinimal[] = R"(
model: {features: [item_id]}
shards: {config: shards.yaml}
)";

TEST(NodeConfigTest, DefaultsFillTheRest) {
  auto c = Parse(kMinimal);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shard_transport, "grpc");
  EXPECT_EQ(c->model_name, "hstu-random-1");
  // The residency event log is the node's largest buffer that fills up with traffic: its default
  // must stay small (at 1 Mi events it held 104 MiB and read as a leak in the soak).
  EXPECT_LE(c->events_retained * sizeof(ResidencyEvent), uint64_t{8} << 20);
}

TEST(NodeConfigTest, TheDeviceIsCpuOrCuda) {
  EXPECT_EQ(Parse(kMinimal)->device, "cpu");
  auto c = Parse(std::string(kMinimal) + "memory: {device: cuda, cuda_device: 2}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "cuda");
  EXPECT_EQ(c->cuda_device, 2u);
  EXPECT_EQ(c->cuda_attention, "bf16");
  auto fp32 =
      Parse("model: {features: [item_id], cuda_attention: fp32}\nshards: {config: shards.yaml}\n");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(fp32->cuda_attention, "fp32");
  EXPECT_EQ(fp32->cuda_gemm, "tf32");  // the default
  auto sgemm =
      Parse("model: {features: [item_id], cuda_gemm: fp32}\nshards: {config: shards.yaml}\n");
  ASSERT_TRUE(sgemm.ok()) << sgemm.status();
  EXPECT_EQ(sgemm->cuda_gemm, "fp32");
  auto half =
      Parse("model: {features: [item_id], cuda_attention: fp16}\nshards: {config: shards.yaml}\n");
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("model.cuda_attention"), std::string::npos)
      << half.status();
  auto bad = Parse(std::string(kMinimal) + "memory: {device: tpu}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("memory.device"), std::string::npos) << bad.status();
}

TEST(NodeConfigTest, RefillCopiesDefaultToTheChunkAndMayBeFiner) {
  auto whole = Parse(std::string(kMinimal) + "refill: {chunk_bytes: 16KiB}\n");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->refill.max_copy_bytes, 16u << 10);
  auto fine = Parse(std::string(kMinimal) + "refill: {chunk_bytes: 16KiB, copy_bytes: 1KiB}\n");
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->refill.chunk_bytes, 16u << 10);
  EXPECT_EQ(fine->refill.max_copy_bytes, 1u << 10);
}

TEST(NodeConfigTest, ErrorsNameTheField) {
  auto expect_error = [](const std::string& yaml, const std::string& field) {
    auto c = Parse(yaml);
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status();
  };
  expect_error("shards: {config: shards.yaml}\n", "model");
  expect_error("model: {features: [nope]}\nshards: {config: shards.yaml}\n",
               "model.features[0]: no table 'nope'");
  // The action table is bf16: the model reads fp32 rows.
  expect_error("model: {features: [action]}\nshards: {config: shards.yaml}\n",
               "model.features[0]: table 'action'");
  expect_error(std::string(kMinimal) + "memory: {initial_alpha: 1.5}\n", "memory.initial_alpha");
  expect_error(std::string(kMinimal) + "memory: {pool_bytes: 1MiB, page_bytes: 1MiB}\n",
               "memory.page_bytes");
  expect_error(std::string(kMinimal) + "node: {slo: fast}\n", "node.slo");
  expect_error(std::string(kMinimal) + "refill: {chunk_bytes: 4KiB, copy_bytes: 8KiB}\n",
               "refill.copy_bytes");
  expect_error(std::string(kMinimal) + "refill: {copy_bytes: 0}\n", "refill.copy_bytes");
  expect_error(std::string(kMinimal) + "queue: {max_batch: 0}\n", "queue.max_batch");
  expect_error(std::string(kMinimal) + "node: {colour: blue}\n", "node.colour");
  expect_error(
      "model: {features: [item_id], max_history: 2000, max_positions: 1024}\n"
      "shards: {config: shards.yaml}\n",
      "model.max_history");
  expect_error("model: {features: [item_id]}\nshards: {config: missing.yaml}\n", "shards.config");
  expect_error("model: {features: [item_id]}\nshards: {config: shards.yaml, transport: smoke}\n",
               "shards.transport");
}

}  // namespace
}  // namespace hlem::serving
