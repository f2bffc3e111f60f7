#include "comm/core/reduce.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "comm/core/errors.h"
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

// Bitwise and/or/xor on every integer dtype, with the sign bit included; refused on floating
// dtypes (as by torch's Gloo backend), with the op and dtype named.
template <typename T>
void ExpectBitwise() {
  const T a[3] = {static_cast<T>(0x5a), static_cast<T>(-1), 0}, b[3] = {static_cast<T>(0x3c), static_cast<T>(0x0f), static_cast<T>(-1)};
  T out[3];
  GetReduceFn(DTypeOf<T>::value, ReduceOp::kBand)(out, a, b, 3);
  EXPECT_EQ(out[0], static_cast<T>(0x18)); EXPECT_EQ(out[1], static_cast<T>(0x0f)); EXPECT_EQ(out[2], static_cast<T>(0));
  GetReduceFn(DTypeOf<T>::value, ReduceOp::kBor)(out, a, b, 3);
  EXPECT_EQ(out[0], static_cast<T>(0x7e)); EXPECT_EQ(out[1], static_cast<T>(-1)); EXPECT_EQ(out[2], static_cast<T>(-1));
  GetReduceFn(DTypeOf<T>::value, ReduceOp::kBxor)(out, a, b, 3);
  EXPECT_EQ(out[0], static_cast<T>(0x66)); EXPECT_EQ(out[1], static_cast<T>(~T{0x0f})); EXPECT_EQ(out[2], static_cast<T>(-1));
}

TEST(ReduceKernelTest, BitwiseOpsOnIntegersRefusedOnFloats) {
  ExpectBitwise<int8_t>();
  ExpectBitwise<uint8_t>();
  ExpectBitwise<int32_t>();
  ExpectBitwise<int64_t>();
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
      try {
        CheckReduceSupported(d, op);
        ADD_FAILURE() << ReduceOpName(op) << " on " << DTypeName(d) << " was accepted";
      } catch (const InvalidArgumentError& e) {
        EXPECT_NE(std::string(e.what()).find(std::string("reduce op ") + ReduceOpName(op)), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(DTypeName(d)), std::string::npos) << e.what();
      }
    }
  }
  // Over several sources in rank order, as the collectives reduce.
  WideScratch scratch;
  std::vector<int32_t> x = {0b1100}, y = {0b1010}, z = {0b0110};
  ReduceInRankOrder({x.data(), y.data(), z.data()}, Buffer{x.data(), 1, DType::kInt32}, ReduceOp::kBxor, scratch);
  EXPECT_EQ(x[0], 0b0000);
}

// Rank-order reduction: the order is fixed (so results are the same bits wherever it runs),
// `out` may alias the first two sources, and half dtypes accumulate in float32.
TEST(ReduceInRankOrderTest, FixedOrderAliasingAndWideAccumulation) {
  WideScratch scratch;
  // 1e8 + 1 - 1e8 in float32: left to right gives 0 (1 is absorbed), another order gives 1.
  std::vector<float> a = {1e8f}, b = {1.0f}, c = {-1e8f};
  ReduceInRankOrder({a.data(), b.data(), c.data()}, Buffer{a.data(), 1, DType::kFloat32}, ReduceOp::kSum, scratch);
  EXPECT_EQ(a[0], 0.0f);
  std::vector<double> x = {1, 2}, y = {3, 4}, z = {5, 6};
  ReduceInRankOrder({x.data(), y.data(), z.data()}, Buffer{y.data(), 2, DType::kFloat64}, ReduceOp::kAvg, scratch);
  EXPECT_EQ(y[0], 3.0);
  EXPECT_EQ(y[1], 4.0);
  std::vector<int32_t> one = {7}, out = {0};
  ReduceInRankOrder({one.data()}, Buffer{out.data(), 1, DType::kInt32}, ReduceOp::kSum, scratch);
  EXPECT_EQ(out[0], 7);
  // float16: 60000 + 60000 - 60000 overflows float16 (max 65504) but not the float32 accumulator.
  std::vector<uint16_t> h1 = {FloatToHalf(60000)}, h2 = {FloatToHalf(60000)}, h3 = {FloatToHalf(-60000)};
  ReduceInRankOrder({h1.data(), h2.data(), h3.data()}, Buffer{h3.data(), 1, DType::kFloat16}, ReduceOp::kSum,
                    scratch);
  EXPECT_EQ(HalfToFloat(h3[0]), 60000.0f);
}

}  // namespace
}  // namespace gossipcc
