#include "embedding_shard/core/table_file.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace hlem::shard {
namespace {

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

constexpr size_t kIoChunk = 4 << 20;

uint64_t HeaderChecksum(std::span<const std::byte> fixed56, std::span<const std::byte> name) {
  Checksum64 sum;
  sum.Update(fixed56);
  sum.Update(name);
  return sum.Finish();
}

}  // namespace

void Checksum64::Update(std::span<const std::byte> bytes) {
  size_t i = 0;
  while (pending_bytes_ != 0 && i < bytes.size()) {
    pending_ |= static_cast<uint64_t>(bytes[i++]) << (8 * pending_bytes_);
    if (++pending_bytes_ == 8) {
      state_ = Mix64(state_ ^ pending_) + length_;
      length_ += 8;
      pending_ = 0;
      pending_bytes_ = 0;
    }
  }
  for (; i + 8 <= bytes.size(); i += 8) {
    state_ = Mix64(state_ ^ Load<uint64_t>(bytes.data() + i)) + length_;
    length_ += 8;
  }
  for (; i < bytes.size(); ++i) {
    pending_ |= static_cast<uint64_t>(bytes[i]) << (8 * pending_bytes_++);
  }
}

uint64_t Checksum64::Finish() const {
  uint64_t s = state_;
  if (pending_bytes_ != 0) s = Mix64(s ^ pending_) + length_;
  return Mix64(s ^ (length_ + static_cast<uint64_t>(pending_bytes_)));
}

absl::StatusOr<TableFileHeader> ParseTableFileHeader(std::span<const std::byte> bytes) {
  if (bytes.size() < kTableFileFixedHeader) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table file: header needs ", kTableFileFixedHeader, " bytes, got ", bytes.size()));
  }
  const std::byte* p = bytes.data();
  if (std::memcmp(p, kTableFileMagic, 8) != 0) {
    return absl::InvalidArgumentError("table file: bad magic (not an HLEM table file)");
  }
  uint32_t version = Load<uint32_t>(p + 8);
  if (version != kTableFileVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("table file: version ", version, " unsupported (expected 1)"));
  }
  TableFileHeader h;
  h.header_bytes = Load<uint32_t>(p + 12);
  h.spec.id = Load<uint32_t>(p + 16);
  uint32_t dtype = Load<uint32_t>(p + 20);
  h.spec.dim = Load<uint32_t>(p + 24);
  uint32_t name_length = Load<uint32_t>(p + 28);
  h.spec.rows = Load<uint64_t>(p + 32);
  h.data_bytes = Load<uint64_t>(p + 40);
  h.data_checksum = Load<uint64_t>(p + 48);
  uint64_t header_checksum = Load<uint64_t>(p + 56);

  if (dtype < 1 || dtype > 3) {
    return absl::InvalidArgumentError(absl::StrCat("table file: dtype ", dtype, " not in [1, 3]"));
  }
  h.spec.dtype = static_cast<Dtype>(dtype);
  if (h.spec.dim < 1 || h.spec.dim > kMaxTableDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("table file: dim ", h.spec.dim, " not in [1, ", kMaxTableDim, "]"));
  }
  if (h.spec.rows < 1 || h.spec.rows > kMaxTableRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("table file: rows ", h.spec.rows, " not in [1, ", kMaxTableRows, "]"));
  }
  if (name_length > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("table file: name_length ", name_length, " over 255"));
  }
  const uint32_t expected_header = (kTableFileFixedHeader + name_length + 63) / 64 * 64;
  if (h.header_bytes != expected_header) {
    return absl::InvalidArgumentError(
        absl::StrCat("table file: header_bytes ", h.header_bytes, ", expected ", expected_header));
  }
  if (h.data_bytes != h.spec.total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table file: data_bytes ", h.data_bytes, " != rows * row_bytes = ", h.spec.total_bytes()));
  }
  if (bytes.size() < kTableFileFixedHeader + name_length) {
    return absl::InvalidArgumentError("table file: truncated in the table name");
  }
  auto name = bytes.subspan(kTableFileFixedHeader, name_length);
  if (HeaderChecksum(bytes.first(56), name) != header_checksum) {
    return absl::DataLossError("table file: header checksum mismatch");
  }
  h.spec.name.assign(reinterpret_cast<const char*>(name.data()), name.size());
  return h;
}

absl::StatusOr<uint64_t> WriteTableFile(
    const std::string& path, const TableSpec& spec,
    const std::function<void(uint64_t row, std::byte* out)>& row_fn) {
  if (spec.name.size() > 255) {
    return absl::InvalidArgumentError("table name longer than 255 bytes");
  }
  File f(std::fopen(path.c_str(), "wb"));
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path));
  const uint32_t header_bytes = (kTableFileFixedHeader + spec.name.size() + 63) / 64 * 64;
  std::vector<std::byte> header(header_bytes);
  // Reserve the header, stream the rows while checksumming, then write the header.
  if (std::fwrite(header.data(), 1, header.size(), f.get()) != header.size()) {
    return absl::UnavailableError(absl::StrCat("write failed: ", path));
  }
  const size_t row_bytes = spec.row_bytes();
  const uint64_t rows_per_chunk = std::max<uint64_t>(1, kIoChunk / row_bytes);
  std::vector<std::byte> chunk(rows_per_chunk * row_bytes);
  Checksum64 sum;
  for (uint64_t first = 0; first < spec.rows; first += rows_per_chunk) {
    uint64_t n = std::min(rows_per_chunk, spec.rows - first);
    for (uint64_t i = 0; i < n; ++i) row_fn(first + i, chunk.data() + i * row_bytes);
    std::span<const std::byte> data(chunk.data(), n * row_bytes);
    sum.Update(data);
    if (std::fwrite(data.data(), 1, data.size(), f.get()) != data.size()) {
      return absl::UnavailableError(absl::StrCat("write failed: ", path));
    }
  }
  std::byte* p = header.data();
  std::memcpy(p, kTableFileMagic, 8);
  Store<uint32_t>(p + 8, kTableFileVersion);
  Store<uint32_t>(p + 12, header_bytes);
  Store<uint32_t>(p + 16, spec.id);
  Store<uint32_t>(p + 20, static_cast<uint32_t>(spec.dtype));
  Store<uint32_t>(p + 24, spec.dim);
  Store<uint32_t>(p + 28, static_cast<uint32_t>(spec.name.size()));
  Store<uint64_t>(p + 32, spec.rows);
  Store<uint64_t>(p + 40, spec.total_bytes());
  Store<uint64_t>(p + 48, sum.Finish());
  std::memcpy(p + 64, spec.name.data(), spec.name.size());
  auto name = std::span<const std::byte>(header).subspan(64, spec.name.size());
  Store<uint64_t>(p + 56, HeaderChecksum(std::span<const std::byte>(header).first(56), name));
  if (std::fseek(f.get(), 0, SEEK_SET) != 0 ||
      std::fwrite(header.data(), 1, header.size(), f.get()) != header.size() ||
      std::fflush(f.get()) != 0) {
    return absl::UnavailableError(absl::StrCat("write failed: ", path));
  }
  return sum.Finish();
}

absl::StatusOr<TableFileHeader> ReadTableFile(
    const std::string& path,
    const std::function<void(uint64_t row, const std::byte* bytes)>& row_fn,
    const TableSpec* expected) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open table file ", path));
  std::vector<std::byte> head(kTableFileFixedHeader + 256);
  size_t got = std::fread(head.data(), 1, head.size(), f.get());
  head.resize(got);
  auto header = ParseTableFileHeader(head);
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(path, ": ", header.status().message()));
  }
  const TableSpec& held = header->spec;
  if (expected != nullptr && (held.rows != expected->rows || held.dim != expected->dim ||
                              held.dtype != expected->dtype || held.id != expected->id)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file holds table ", held.id, " with ", held.rows, "x", held.dim, " ",
                     DtypeName(held.dtype), ", config says table ", expected->id, " with ",
                     expected->rows, "x", expected->dim, " ", DtypeName(expected->dtype)));
  }
  if (std::fseek(f.get(), header->header_bytes, SEEK_SET) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": truncated"));
  }
  const size_t row_bytes = header->spec.row_bytes();
  const uint64_t rows_per_chunk = std::max<uint64_t>(1, kIoChunk / row_bytes);
  std::vector<std::byte> chunk(rows_per_chunk * row_bytes);
  Checksum64 sum;
  for (uint64_t first = 0; first < header->spec.rows; first += rows_per_chunk) {
    uint64_t n = std::min(rows_per_chunk, header->spec.rows - first);
    size_t want = n * row_bytes;
    if (std::fread(chunk.data(), 1, want, f.get()) != want) {
      return absl::DataLossError(absl::StrCat(path, ": truncated at row ", first));
    }
    sum.Update(std::span<const std::byte>(chunk.data(), want));
    for (uint64_t i = 0; i < n; ++i) row_fn(first + i, chunk.data() + i * row_bytes);
  }
  if (sum.Finish() != header->data_checksum) {
    return absl::DataLossError(absl::StrCat(path, ": data checksum mismatch"));
  }
  return *header;
}

}  // namespace hlem::shard
