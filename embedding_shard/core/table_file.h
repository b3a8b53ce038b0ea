#pragma once
// The HLEM table file: one embedding table, checksummed. Format (little-endian), version 1:
//
//   offset  size  field
//        0     8  magic "HLEMTBL1"
//        8     4  version (1)
//       12     4  header_bytes: offset of the row data (64 + name, rounded up to 64)
//       16     4  table_id
//       20     4  dtype (1 fp32, 2 fp16, 3 bf16)
//       24     4  dim
//       28     4  name_length (<= 255)
//       32     8  rows
//       40     8  data_bytes (= rows * dim * dtype bytes)
//       48     8  data_checksum: Checksum64 of the data_bytes bytes of row data
//       56     8  header_checksum: Checksum64 of bytes [0, 56) followed by the name
//       64     n  name (UTF-8, not NUL-terminated), zero padding up to header_bytes
//  header_bytes   rows, row-major, in row-id order
//
// Documented in docs/table_file.md. `hlem table write` produces one from the generator.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "embedding_shard/core/table.h"

namespace hlem::shard {

inline constexpr char kTableFileMagic[8] = {'H', 'L', 'E', 'M', 'T', 'B', 'L', '1'};
inline constexpr uint32_t kTableFileVersion = 1;
inline constexpr size_t kTableFileFixedHeader = 64;

struct TableFileHeader {
  TableSpec spec;
  uint32_t header_bytes = 0;
  uint64_t data_bytes = 0;
  uint64_t data_checksum = 0;
};

// A position-dependent 64-bit checksum; Update() may be called on consecutive chunks of any size.
class Checksum64 {
 public:
  void Update(std::span<const std::byte> bytes);
  uint64_t Finish() const;

 private:
  uint64_t state_ = 0x243f6a8885a308d3ULL;
  uint64_t length_ = 0;
  uint64_t pending_ = 0;  // bytes of an incomplete 8-byte word
  int pending_bytes_ = 0;
};

// Decodes and checks a header from the first bytes of a file (at least kTableFileFixedHeader;
// the name must be within `bytes`). Every field is range-checked; errors say which.
absl::StatusOr<TableFileHeader> ParseTableFileHeader(std::span<const std::byte> bytes);

// Writes a table whose row r is produced by row_fn(r, out). Returns the data checksum.
absl::StatusOr<uint64_t> WriteTableFile(
    const std::string& path, const TableSpec& spec,
    const std::function<void(uint64_t row, std::byte* out)>& row_fn);

// Reads the file sequentially, calling row_fn(row, bytes) for every row, and verifies the data
// checksum at the end (DATA_LOSS on mismatch: callers must discard what they copied). With
// `expected`, a file holding another table (id, rows, dim or dtype) is INVALID_ARGUMENT before
// any row is read, so row_fn may rely on the expected row size.
absl::StatusOr<TableFileHeader> ReadTableFile(
    const std::string& path,
    const std::function<void(uint64_t row, const std::byte* bytes)>& row_fn,
    const TableSpec* expected = nullptr);

}  // namespace hlem::shard
