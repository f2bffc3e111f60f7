#include "comm/reduce.h"

#include <cmath>
#include <limits>

#include "comm/errors.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace {

TEST(HalfConversionTest, RoundTripsEveryFloat16BitPattern) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = HalfToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), bits) << std::hex << bits;
  }
}

TEST(HalfConversionTest, RoundsToNearestEvenAndSaturatesToInfinity) {
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 1.0f / 2048)), 1.0f);               // tie -> even
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);  // tie -> even (up)
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(65520.0f))));
  EXPECT_EQ(HalfToFloat(FloatToHalf(5.960464477539063e-08f)), 5.960464477539063e-08f);  // smallest subnormal
  EXPECT_EQ(HalfToFloat(FloatToHalf(1e-9f)), 0.0f);
}

TEST(BFloat16ConversionTest, RoundTripsAndRounds) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToBFloat16(f), bits);
  }
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 1.0f / 256)), 1.0f);  // tie -> even
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(ReduceKernelTest, IntegerSumsWrapLikeTorch) {
  int8_t a[2] = {120, -128}, b[2] = {10, -1}, out[2];
  GetReduceFn(DType::kInt8, ReduceOp::kSum)(out, a, b, 2);
  EXPECT_EQ(out[0], static_cast<int8_t>(-126));
  EXPECT_EQ(out[1], static_cast<int8_t>(127));
}

TEST(ReduceKernelTest, RejectsAvgOnIntegersAndDirectHalfKernels) {
  EXPECT_THROW(GetReduceFn(DType::kInt32, ReduceOp::kAvg), InvalidArgumentError);
  EXPECT_THROW(GetReduceFn(DType::kFloat16, ReduceOp::kSum), InvalidArgumentError);
}

}  // namespace
}  // namespace gossipcc
