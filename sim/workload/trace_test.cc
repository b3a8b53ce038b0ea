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
  std::string Write(uint64_t seed, const std::string& name, bool generated = true) {
    const std::string p = Path(name);
    paths_.push_back(p);
    auto g = *WorkloadGenerator::Create(testing::TinyWorkload(seed));
    auto n = WriteTrace(*g, p, generated);
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

// Reads `path` back and checks it holds exactly the requests of the seed's generator.
void ExpectGeneratorsRequests(const std::string& path, uint64_t seed) {
  auto reader = *TraceReader::Open(path);
  auto g = *WorkloadGenerator::Create(testing::TinyWorkload(seed));
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

TEST_F(TraceTest, RoundTripsByteForByte) {
  const std::string a = Write(7, "a"), b = Write(7, "b"), c = Write(8, "c");
  EXPECT_EQ(Bytes(a), Bytes(b));
  EXPECT_NE(Bytes(a), Bytes(c));

  auto reader = *TraceReader::Open(a);
  EXPECT_EQ(reader->header().seed, 7u);
  EXPECT_EQ(reader->header().duration_ns, 5'000'000'000u);
  EXPECT_TRUE(reader->header().generated_events);
  ASSERT_EQ(reader->header().features.size(), 2u);
  EXPECT_EQ(reader->header().features[1].name, "category");
  auto config = ParseWorkloadConfig(reader->header().config_yaml);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->seed, 7u);
  ExpectGeneratorsRequests(a, 7);
}

TEST_F(TraceTest, ExplicitEventsReadBackTheSameAndVersionOneStillReads) {
  const std::string generated = Write(7, "gen"), explicit_ = Write(7, "explicit", false);
  EXPECT_FALSE((*TraceReader::Open(explicit_))->header().generated_events);
  EXPECT_GT(Bytes(explicit_).size(), Bytes(generated).size());
  ExpectGeneratorsRequests(explicit_, 7);

  // Version 1: version field 1, no events byte after the feature tables (explicit events), the
  // footer's FNV-1a over the records only.
  std::string v1 = Bytes(explicit_);
  const std::string last_name = "category";  // the second one: the first is in the config YAML
  const size_t mode = v1.find(last_name, v1.find(last_name) + 1) + last_name.size();
  ASSERT_EQ(v1[mode], '\0');
  v1.erase(mode, 1);
  v1[8] = 1;
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (size_t i = mode; i < v1.size() - 17; ++i) {
    hash = (hash ^ static_cast<uint8_t>(v1[i])) * 0x100000001b3ULL;
  }
  v1.replace(v1.size() - 8, 8, reinterpret_cast<const char*>(&hash), 8);
  const std::string p = Path("v1");
  paths_.push_back(p);
  std::ofstream(p, std::ios::binary) << v1;
  ExpectGeneratorsRequests(p, 7);
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
  std::string seed_digit = bytes;  // the header's config: another seed, the same shape
  const size_t seed = seed_digit.find("seed: 7");
  ASSERT_NE(seed, std::string::npos);
  seed_digit[seed + 6] = '8';
  EXPECT_THAT(std::string(variant("seed", seed_digit).message()), HasSubstr("checksum"));
  std::string future = bytes;
  future[8] = 9;
  EXPECT_THAT(std::string(variant("version", future).message()), HasSubstr("version 9"));
  // A generated trace whose header's generator config does not read.
  std::string config = bytes;
  const size_t at = config.find("communities: ");
  ASSERT_NE(at, std::string::npos);
  config[at + 13] = 'x';
  EXPECT_THAT(std::string(variant("config", config).message()),
              HasSubstr("generator config does not read"));
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
