#include "sim/workload/trace.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/workload/workload_testing.h"

namespace hlem::sim {
namespace {

using ::testing::HasSubstr;

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class TraceTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) {
    return ::testing::TempDir() + "/hlem_trace_" + std::to_string(getpid()) + "_" + name;
  }
  void TearDown() override {
    for (const std::string& p : paths_) std::filesystem::remove(p);
  }
  std::string Write(uint64_t seed, const std::string& name) {
    const std::string p = Path(name);
    paths_.push_back(p);
    auto g = *WorkloadGenerator::Create(testing::TinyWorkload(seed));
    auto n = WriteTrace(*g, p);
    EXPECT_TRUE(n.ok()) << n.status();
    return p;
  }
  absl::Status ReadAll(const std::string& path) {
    auto r = TraceReader::Open(path);
    if (!r.ok()) return r.status();
    TraceRequest req;
    while (true) {
      absl::StatusOr<bool> more = (*r)->Next(&req);
      if (!more.ok()) return more.status();
      if (!*more) return absl::OkStatus();
    }
  }
  std::vector<std::string> paths_;
};

TEST_F(TraceTest, RoundTripsByteForByte) {
  const std::string a = Write(7, "a"), b = Write(7, "b"), c = Write(8, "c");
  EXPECT_EQ(Bytes(a), Bytes(b));
  EXPECT_NE(Bytes(a), Bytes(c));

  auto reader = *TraceReader::Open(a);
  EXPECT_EQ(reader->header().seed, 7u);
  EXPECT_EQ(reader->header().duration_ns, 5'000'000'000u);
  ASSERT_EQ(reader->header().features.size(), 2u);
  EXPECT_EQ(reader->header().features[1].name, "category");
  auto config = ParseWorkloadConfig(reader->header().config_yaml);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->seed, 7u);

  auto g = *WorkloadGenerator::Create(testing::TinyWorkload(7));
  TraceRequest want, got;
  uint64_t n = 0;
  while (g->Next(&want)) {
    ASSERT_TRUE(*reader->Next(&got));
    ASSERT_EQ(got, want) << "record " << n;
    ++n;
  }
  EXPECT_FALSE(*reader->Next(&got));
  EXPECT_GT(n, 400u);
  EXPECT_EQ(reader->records(), n);
}

TEST_F(TraceTest, DamageIsAnErrorNotAShortTrace) {
  const std::string good = Write(7, "good");
  const std::string bytes = Bytes(good);
  auto variant = [&](const std::string& name, const std::string& content) {
    const std::string p = Path(name);
    paths_.push_back(p);
    std::ofstream(p, std::ios::binary) << content;
    return ReadAll(p);
  };
  EXPECT_TRUE(ReadAll(good).ok());
  EXPECT_THAT(std::string(variant("trunc", bytes.substr(0, bytes.size() / 2)).message()),
              HasSubstr("trace:"));
  EXPECT_THAT(std::string(variant("nofooter", bytes.substr(0, bytes.size() - 17)).message()),
              HasSubstr("no footer"));
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x01;
  EXPECT_FALSE(variant("flip", flipped).ok());
  EXPECT_THAT(std::string(variant("magic", "NOTATRACE" + bytes.substr(9)).message()),
              HasSubstr("bad magic"));
  EXPECT_FALSE(variant("extra", bytes + "x").ok());
  EXPECT_EQ(TraceReader::Open(Path("missing")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TraceTest, WriterRejectsRaggedOrBackwardRequests) {
  const std::string p = Path("w");
  paths_.push_back(p);
  auto w = *TraceWriter::Create(p, {.features = {{"item", 0, 10}, {"cat", 1, 10}}});
  EXPECT_EQ(w->Append({.t_ns = 5, .user = 1, .new_events = {1, 2, 3}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(w->Append({.t_ns = 5, .user = 1, .new_events = {1, 2}}).ok());
  EXPECT_EQ(w->Append({.t_ns = 4, .user = 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(w->Finish().ok());
  EXPECT_TRUE(ReadAll(p).ok());
}

}  // namespace
}  // namespace hlem::sim
