#include "embedding_shard/core/table_file.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hlem::shard {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TableSpec Spec() {
  return TableSpec{.id = 4, .name = "items", .rows = 1000, .dim = 24, .dtype = Dtype::kBf16};
}

TEST(Checksum64Test, ChunkingDoesNotMatter) {
  std::vector<std::byte> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = std::byte(i * 7);
  Checksum64 whole;
  whole.Update(data);
  for (size_t split : {1u, 3u, 8u, 13u, 999u}) {
    Checksum64 parts;
    parts.Update(std::span(data).first(split));
    parts.Update(std::span(data).subspan(split));
    EXPECT_EQ(parts.Finish(), whole.Finish()) << split;
  }
  data[500] ^= std::byte{1};
  Checksum64 flipped;
  flipped.Update(data);
  EXPECT_NE(flipped.Finish(), whole.Finish());
}

TEST(TableFileTest, RoundTrip) {
  std::string path = TempPath("roundtrip.hlemtbl");
  TableSpec spec = Spec();
  ASSERT_TRUE(WriteTableFile(path, spec, [&](uint64_t r, std::byte* out) {
                GenerateRow(5, spec, r, out);
              }).ok());
  uint64_t rows_seen = 0;
  std::vector<std::byte> expected(spec.row_bytes());
  auto header = ReadTableFile(path, [&](uint64_t r, const std::byte* bytes) {
    GenerateRow(5, spec, r, expected.data());
    EXPECT_EQ(std::memcmp(bytes, expected.data(), spec.row_bytes()), 0) << r;
    ++rows_seen;
  });
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(rows_seen, spec.rows);
  EXPECT_EQ(header->spec.name, "items");
  EXPECT_EQ(header->spec.id, 4u);
  EXPECT_EQ(header->spec.dtype, Dtype::kBf16);
  EXPECT_EQ(header->header_bytes, 128u);
}

TEST(TableFileTest, DetectsCorruptData) {
  std::string path = TempPath("corrupt.hlemtbl");
  TableSpec spec = Spec();
  ASSERT_TRUE(WriteTableFile(path, spec, [&](uint64_t r, std::byte* out) {
                GenerateRow(5, spec, r, out);
              }).ok());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(128 + 4000);
    char c = 0x55;
    f.write(&c, 1);
  }
  auto header = ReadTableFile(path, [](uint64_t, const std::byte*) {});
  ASSERT_FALSE(header.ok());
  EXPECT_EQ(header.status().code(), absl::StatusCode::kDataLoss);
}

TEST(TableFileTest, AnotherTableIsRefusedBeforeAnyRowIsRead) {
  std::string path = TempPath("other.hlemtbl");
  TableSpec spec = Spec();
  ASSERT_TRUE(WriteTableFile(path, spec, [&](uint64_t r, std::byte* out) {
                GenerateRow(5, spec, r, out);
              }).ok());
  for (auto change : std::vector<std::function<void(TableSpec*)>>{
           [](TableSpec* s) { s->dim *= 2; }, [](TableSpec* s) { s->rows += 1; },
           [](TableSpec* s) { s->id += 1; },
           [](TableSpec* s) {
             s->dtype = s->dtype == Dtype::kFp32 ? Dtype::kFp16 : Dtype::kFp32;
           }}) {
    TableSpec expected = spec;
    change(&expected);
    uint64_t rows_read = 0;
    auto header = ReadTableFile(
        path, [&](uint64_t, const std::byte*) { ++rows_read; }, &expected);
    EXPECT_EQ(header.status().code(), absl::StatusCode::kInvalidArgument) << header.status();
    EXPECT_THAT(std::string(header.status().message()), HasSubstr("config says table"));
    EXPECT_EQ(rows_read, 0u);
  }
  uint64_t rows_read = 0;
  ASSERT_TRUE(ReadTableFile(
                  path, [&](uint64_t, const std::byte*) { ++rows_read; }, &spec)
                  .ok());
  EXPECT_EQ(rows_read, spec.rows);
}

TEST(TableFileTest, DetectsTruncation) {
  std::string path = TempPath("short.hlemtbl");
  TableSpec spec = Spec();
  ASSERT_TRUE(WriteTableFile(path, spec, [&](uint64_t r, std::byte* out) {
                GenerateRow(5, spec, r, out);
              }).ok());
  std::vector<char> bytes(128 + 100);
  {
    std::ifstream in(path, std::ios::binary);
    in.read(bytes.data(), bytes.size());
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size());
  }
  auto header = ReadTableFile(path, [](uint64_t, const std::byte*) {});
  EXPECT_EQ(header.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(
      ReadTableFile(TempPath("missing.hlemtbl"), [](uint64_t, const std::byte*) {}).status().code(),
      absl::StatusCode::kNotFound);
}

TEST(TableFileTest, HeaderFieldsAreChecked) {
  std::string path = TempPath("header.hlemtbl");
  TableSpec spec = Spec();
  ASSERT_TRUE(
      WriteTableFile(path, spec, [](uint64_t, std::byte* out) { out[0] = std::byte{1}; }).ok());
  std::vector<std::byte> header(128);
  {
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(header.data()), header.size());
  }
  ASSERT_TRUE(ParseTableFileHeader(header).ok());
  auto with = [&](size_t offset, uint32_t value) {
    std::vector<std::byte> h = header;
    std::memcpy(h.data() + offset, &value, 4);
    return ParseTableFileHeader(h).status();
  };
  EXPECT_NE(with(0, 0x41414141).message().find("magic"), std::string_view::npos);
  EXPECT_NE(with(8, 2).message().find("version"), std::string_view::npos);
  EXPECT_NE(with(20, 9).message().find("dtype"), std::string_view::npos);
  EXPECT_NE(with(24, 0).message().find("dim"), std::string_view::npos);
  EXPECT_NE(with(28, 300).message().find("name_length"), std::string_view::npos);
  EXPECT_EQ(with(16, 5).code(), absl::StatusCode::kDataLoss);  // table id: header checksum
  EXPECT_FALSE(ParseTableFileHeader(std::span(header).first(10)).ok());
}

}  // namespace
}  // namespace hlem::shard
