#include "embedding_shard/core/table.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/rng.h"

namespace hlem::shard {

size_t DtypeBytes(Dtype dtype) { return dtype == Dtype::kFp32 ? 4 : 2; }

absl::string_view DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp32:
      return "fp32";
    case Dtype::kFp16:
      return "fp16";
    case Dtype::kBf16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<Dtype> ParseDtype(absl::string_view name) {
  if (name == "fp32" || name == "float32") return Dtype::kFp32;
  if (name == "fp16" || name == "float16") return Dtype::kFp16;
  if (name == "bf16" || name == "bfloat16") return Dtype::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "'; allowed: fp32, fp16, bf16"));
}

uint16_t FloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);  // underflow -> signed zero
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent
  return static_cast<uint16_t>(half);
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(x);
}

uint16_t FloatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

namespace {
inline float ValueFromHash(uint64_t h) {
  // 24 random bits -> [-1, 1): exactly representable in fp32.
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * 0x1.0p-23f;
}
}  // namespace

float GeneratedValue(uint64_t seed, uint32_t table_id, uint64_t row, uint32_t col) {
  return ValueFromHash(Mix64(KeyedHash(seed, table_id, row) + col));
}

void GenerateRow(uint64_t seed, const TableSpec& spec, uint64_t row, std::byte* out) {
  const uint64_t row_key = KeyedHash(seed, spec.id, row);
  for (uint32_t c = 0; c < spec.dim; ++c) {
    float v = ValueFromHash(Mix64(row_key + c));
    switch (spec.dtype) {
      case Dtype::kFp32:
        std::memcpy(out + 4 * c, &v, 4);
        break;
      case Dtype::kFp16: {
        uint16_t h = FloatToHalf(v);
        std::memcpy(out + 2 * c, &h, 2);
        break;
      }
      case Dtype::kBf16: {
        uint16_t b = FloatToBf16(v);
        std::memcpy(out + 2 * c, &b, 2);
        break;
      }
    }
  }
}

}  // namespace hlem::shard
