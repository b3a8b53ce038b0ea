#include "sim/workload/trace.h"

#include <cstring>
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

// The offset of the events-mode byte of a TinyWorkload trace: right after the last feature
// table's name ("category", found twice: the config YAML holds it first).
size_t EventsModeAt(const std::string& bytes) {
  const std::string last_name = "category";
  return bytes.find(last_name, bytes.find(last_name) + 1) + last_name.size();
}

// Recomputes the footer's FNV-1a over the bytes from `from` (0 for version 2 on, which hashes the
// header; the records' start for version 1) to the footer (u8 0 · u64 count · u64 hash).
void Rehash(std::string* bytes, size_t from) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (size_t i = from; i < bytes->size() - 17; ++i) {
    hash = (hash ^ static_cast<uint8_t>((*bytes)[i])) * 0x100000001b3ULL;
  }
  bytes->replace(bytes->size() - 8, 8, reinterpret_cast<const char*>(&hash), 8);
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
  // Writes `content` to a temporary file (removed after the test); returns its path.
  std::string Save(const std::string& name, const std::string& content) {
    const std::string p = Path(name);
    paths_.push_back(p);
    std::ofstream(p, std::ios::binary) << content;
    return p;
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

  // Version 1: version field 1, no events byte nor generator version after the feature tables
  // (explicit events), the footer's FNV-1a over the records only.
  std::string v1 = Bytes(explicit_);
  const size_t mode = EventsModeAt(v1);
  ASSERT_EQ(v1[mode], '\0');
  v1.erase(mode, 5);
  v1[8] = 1;
  Rehash(&v1, mode);
  ExpectGeneratorsRequests(Save("v1", v1), 7);
}

// Version 2 recorded no generator version: its generated traces read as they are. Version 3
// refuses a generated trace of another generator version (its events would come out different).
TEST_F(TraceTest, GeneratedTracesOfAnotherGeneratorVersionAreRefused) {
  const std::string v3 = Bytes(Write(7, "gen"));
  const size_t mode = EventsModeAt(v3);
  ASSERT_EQ(v3[mode], '\1');
  uint32_t recorded = 0;
  std::memcpy(&recorded, v3.data() + mode + 1, 4);
  EXPECT_EQ(recorded, static_cast<uint32_t>(kGeneratorVersion));
  EXPECT_EQ((*TraceReader::Open(Save("v3", v3)))->header().generator_version, recorded);

  std::string v2 = v3;
  v2.erase(mode + 1, 4);
  v2[8] = 2;
  Rehash(&v2, 0);
  const std::string v2_path = Save("v2", v2);
  EXPECT_EQ((*TraceReader::Open(v2_path))->header().generator_version, 0u);
  ExpectGeneratorsRequests(v2_path, 7);

  std::string other = v3;
  const uint32_t next = recorded + 1;
  std::memcpy(other.data() + mode + 1, &next, 4);
  Rehash(&other, 0);
  const absl::Status st = TraceReader::Open(Save("other", other)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("generator version"));
}

TEST_F(TraceTest, DamageIsAnErrorNotAShortTrace) {
  const std::string good = Write(7, "good");
  const std::string bytes = Bytes(good);
  auto variant = [&](const std::string& name, const std::string& content) {
    return ReadAll(Save(name, content));
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

// For the simulator's sketched histories: first visits come without their events, counted in
// omitted_events; every other request reads as it is. The generator leaves out the same
// (Events::kReturning: what training in the twin replays without a trace file).
TEST_F(TraceTest, FirstVisitsCanBeReadWithoutTheirEvents) {
  const std::string path = Write(7, "omit");
  auto plain = *TraceReader::Open(path);
  auto omit = *TraceReader::Open(path);
  omit->OmitFirstVisits(true);
  auto generated = *WorkloadGenerator::Create(testing::TinyWorkload(7));
  TraceRequest want, got, drawn;
  uint64_t first_visits = 0, n = 0;
  while (*plain->Next(&want)) {
    ASSERT_TRUE(*omit->Next(&got));
    ASSERT_TRUE(generated->Next(&drawn, WorkloadGenerator::Events::kReturning));
    ASSERT_EQ(drawn, got) << "record " << n;
    ++n;
    if (want.prior_events == 0) {
      ++first_visits;
      EXPECT_TRUE(got.new_events.empty());
      EXPECT_EQ(got.omitted_events, want.new_events.size() / 2);
      got.new_events = want.new_events;
      got.omitted_events = 0;
    }
    ASSERT_EQ(got, want) << "record " << n;
  }
  EXPECT_FALSE(*omit->Next(&got));
  EXPECT_FALSE(generated->Next(&drawn, WorkloadGenerator::Events::kReturning));
  EXPECT_GT(first_visits, 10u);
  EXPECT_LT(first_visits, n);
}

// A record's counts are checked before anything is sized from them (trace_file_fuzz: a count of
// 2^31 made the reader allocate 32 GiB). Explicit ids must also be backed by the file's bytes.
TEST_F(TraceTest, RecordsClaimingMoreIdsThanARequestMayCarryAreRefused) {
  auto varint = [](uint64_t v) {
    std::string out;
    for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    out.push_back(static_cast<char>(v));
    return out;
  };
  // Tag 1, dt 0, user 1, no prior events, `events` events, and a few bytes more.
  auto record = [&](uint64_t events) {
    return "\x01" + varint(0) + varint(1) + varint(0) + varint(events) + std::string(40, '\x03');
  };
  const std::string generated = Bytes(Write(7, "generated"));
  const std::string header = generated.substr(0, EventsModeAt(generated) + 1 + 4);
  EXPECT_THAT(std::string(ReadAll(Save("huge-generated", header + record(1ULL << 31))).message()),
              HasSubstr("more than the header's generator draws"));
  std::string explicit_header = header;
  explicit_header[EventsModeAt(generated)] = 0;
  EXPECT_THAT(std::string(ReadAll(Save("huge", explicit_header + record(1ULL << 30))).message()),
              HasSubstr("a request may carry"));
  EXPECT_THAT(std::string(ReadAll(Save("short", explicit_header + record(1ULL << 23))).message()),
              HasSubstr("truncated"));

  const std::string p = Path("w-huge");
  paths_.push_back(p);
  auto w = *TraceWriter::Create(p, {.features = {{"item", 0, 10}}, .generated_events = true});
  EXPECT_EQ(w->Append({.t_ns = 1, .user = 1, .omitted_events = kMaxRequestIds + 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(w->Append({.t_ns = 1, .user = 1, .omitted_events = kMaxRequestIds}).ok());
}

TEST_F(TraceTest, WriterRejectsRaggedOrBackwardRequests) {
  const std::string p = Path("w");
  paths_.push_back(p);
  auto w = *TraceWriter::Create(p, {.features = {{"item", 0, 10}, {"cat", 1, 10}}});
  EXPECT_EQ(w->Append({.t_ns = 5, .user = 1, .new_events = {1, 2, 3}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(w->Append({.t_ns = 5, .user = 1, .new_events = {1, 2}}).ok());
  EXPECT_EQ(w->Append({.t_ns = 4, .user = 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Append({.t_ns = 6, .user = 1, .omitted_events = 3}).code(),
            absl::StatusCode::kInvalidArgument);  // explicit events cannot be left out
  EXPECT_TRUE(w->Finish().ok());
  EXPECT_TRUE(ReadAll(p).ok());
}

// A trace of generated events stores counts: the generator need not draw the events to write
// it, and the file is the same byte for byte.
TEST_F(TraceTest, GeneratedTracesAreWrittenWithoutDrawingTheEvents) {
  const WorkloadConfig c = testing::TinyWorkload(11);
  auto drawn = *WorkloadGenerator::Create(c);
  auto counted = *WorkloadGenerator::Create(c);
  const std::string a = Path("drawn"), b = Path("counted");
  paths_.push_back(a);
  paths_.push_back(b);
  TraceHeader header{.seed = c.seed,
                     .duration_ns = drawn->duration_ns(),
                     .config_yaml = WorkloadConfigYaml(c),
                     .features = c.features,
                     .generated_events = true};
  auto wa = *TraceWriter::Create(a, header);
  auto wb = *TraceWriter::Create(b, header);
  TraceRequest ra, rb;
  uint64_t events = 0;
  while (drawn->Next(&ra)) {
    ASSERT_TRUE(counted->Next(&rb, WorkloadGenerator::Events::kNone));
    EXPECT_TRUE(rb.new_events.empty());
    ASSERT_EQ(rb.omitted_events * 2, ra.new_events.size());
    events += rb.omitted_events;
    ASSERT_TRUE(wa->Append(ra).ok());
    ASSERT_TRUE(wb->Append(rb).ok());
  }
  EXPECT_FALSE(counted->Next(&rb, WorkloadGenerator::Events::kNone));
  ASSERT_TRUE(wa->Finish().ok());
  ASSERT_TRUE(wb->Finish().ok());
  EXPECT_GT(events, 1000u);
  EXPECT_EQ(Bytes(a), Bytes(b));
  ASSERT_TRUE(ReadAll(b).ok());
}

}  // namespace
}  // namespace hlem::sim
