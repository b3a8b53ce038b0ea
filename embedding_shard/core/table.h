#pragma once
// Embedding tables: their shape, element types and deterministic content.
//
// A table is `rows x dim` elements of fp32, fp16 or bf16, stored row-major and little-endian. The
// generated content is a pure function of (seed, table id, row, column), so any test or client
// can compute the bytes a shard must return without asking the shard.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hlem::shard {

enum class Dtype : uint32_t { kFp32 = 1, kFp16 = 2, kBf16 = 3 };

size_t DtypeBytes(Dtype dtype);
absl::string_view DtypeName(Dtype dtype);  // "fp32", "fp16", "bf16"
absl::StatusOr<Dtype> ParseDtype(absl::string_view name);

uint16_t FloatToHalf(float f);  // IEEE binary16, round to nearest even
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float f);  // round to nearest even
float Bf16ToFloat(uint16_t b);

struct TableSpec {
  uint32_t id = 0;
  std::string name;
  uint64_t rows = 0;
  uint32_t dim = 0;
  Dtype dtype = Dtype::kFp32;

  size_t row_bytes() const { return static_cast<size_t>(dim) * DtypeBytes(dtype); }
  uint64_t total_bytes() const { return rows * row_bytes(); }
};

// Largest values accepted anywhere a table is described (config, files, RPCs).
inline constexpr uint64_t kMaxTableRows = uint64_t{1} << 40;
inline constexpr uint32_t kMaxTableDim = 1 << 16;

// The generated value of one element, in [-1, 1).
float GeneratedValue(uint64_t seed, uint32_t table_id, uint64_t row, uint32_t col);
// Writes row `row` of the generated table into out[0, spec.row_bytes()).
void GenerateRow(uint64_t seed, const TableSpec& spec, uint64_t row, std::byte* out);

}  // namespace hlem::shard
