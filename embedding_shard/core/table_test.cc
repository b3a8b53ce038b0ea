#include "embedding_shard/core/table.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace hlem::shard {
namespace {

TEST(DtypeTest, ParseAndName) {
  EXPECT_EQ(*ParseDtype("fp32"), Dtype::kFp32);
  EXPECT_EQ(*ParseDtype("bf16"), Dtype::kBf16);
  EXPECT_EQ(*ParseDtype("float16"), Dtype::kFp16);
  auto bad = ParseDtype("int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("int8"), std::string_view::npos);
  EXPECT_EQ(DtypeName(Dtype::kFp16), "fp16");
  EXPECT_EQ(DtypeBytes(Dtype::kFp32), 4u);
  EXPECT_EQ(DtypeBytes(Dtype::kBf16), 2u);
}

TEST(DtypeTest, HalfKnownValues) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);               // overflow -> inf
  EXPECT_EQ(FloatToHalf(5.9604645e-08f), 0x0001);     // smallest subnormal
  EXPECT_EQ(FloatToHalf(1.0f + 0x1.0p-11f), 0x3c00);  // tie -> even (down)
  EXPECT_EQ(FloatToHalf(1.0f + 0x1.8p-10f), 0x3c02);  // tie -> even (up)
  EXPECT_FLOAT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_FLOAT_EQ(HalfToFloat(0x0001), 5.9604645e-08f);
}

TEST(DtypeTest, HalfRoundTripIsExactForHalfValues) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(DtypeTest, Bf16KnownValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-1.5f), 0xbfc0);
  EXPECT_FLOAT_EQ(Bf16ToFloat(0x4049), 3.140625f);
  EXPECT_EQ(FloatToBf16(1.0f + 0x1.0p-8f), 0x3f80);  // tie -> even
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

TEST(GeneratorTest, DeterministicAndKeyed) {
  EXPECT_EQ(GeneratedValue(1, 2, 3, 4), GeneratedValue(1, 2, 3, 4));
  EXPECT_NE(GeneratedValue(1, 2, 3, 4), GeneratedValue(1, 2, 3, 5));
  EXPECT_NE(GeneratedValue(1, 2, 3, 4), GeneratedValue(1, 2, 4, 4));
  EXPECT_NE(GeneratedValue(1, 2, 3, 4), GeneratedValue(1, 3, 3, 4));
  EXPECT_NE(GeneratedValue(1, 2, 3, 4), GeneratedValue(2, 2, 3, 4));
  double sum = 0;
  for (uint32_t c = 0; c < 10000; ++c) {
    float v = GeneratedValue(7, 0, 1, c);
    ASSERT_GE(v, -1.0f);
    ASSERT_LT(v, 1.0f);
    sum += v;
  }
  EXPECT_NEAR(sum / 10000, 0.0, 0.03);
}

TEST(GeneratorTest, RowMatchesElementFunctionInEveryDtype) {
  for (Dtype dtype : {Dtype::kFp32, Dtype::kFp16, Dtype::kBf16}) {
    TableSpec spec{.id = 3, .name = "t", .rows = 100, .dim = 33, .dtype = dtype};
    std::vector<std::byte> row(spec.row_bytes());
    GenerateRow(99, spec, 42, row.data());
    for (uint32_t c = 0; c < spec.dim; ++c) {
      float expected = GeneratedValue(99, 3, 42, c);
      if (dtype == Dtype::kFp32) {
        float got;
        std::memcpy(&got, row.data() + 4 * c, 4);
        EXPECT_EQ(got, expected);
      } else {
        uint16_t got;
        std::memcpy(&got, row.data() + 2 * c, 2);
        EXPECT_EQ(got, dtype == Dtype::kFp16 ? FloatToHalf(expected) : FloatToBf16(expected));
      }
    }
  }
}

}  // namespace
}  // namespace hlem::shard
