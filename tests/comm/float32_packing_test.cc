#include "comm/gloo/float32_packing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace gossipcc {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

std::vector<uint8_t> Pack(const std::vector<uint32_t>& values) {
  std::vector<uint8_t> out(PackedFloat32Bound(values.size()));
  const size_t n = PackFloat32(values, out.data());
  EXPECT_LE(n, out.size());
  out.resize(n);
  return out;
}

// Packs, unpacks from a slot larger than the message (as the ring receives), and checks
// every bit came back.
size_t RoundTrip(const std::vector<uint32_t>& values) {
  std::vector<uint8_t> packed = Pack(values);
  const size_t n = packed.size();
  packed.resize(n + 100, 0xee);  // stale bytes of the slot after the message
  std::vector<uint32_t> back(values.size(), 0xdeadbeef);
  const absl::Status status = UnpackFloat32(packed, absl::MakeSpan(back));
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(back, values);
  return n;
}

std::vector<uint32_t> Normal(size_t count, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<uint32_t> v(count);
  for (auto& x : v) x = Bits(dist(rng));
  return v;
}

TEST(Float32PackingTest, EveryCountAroundBlockAndGroupEdgesRoundTrips) {
  for (size_t count : {0, 1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129, 200, 1000, 4097}) {
    SCOPED_TRACE(count);
    RoundTrip(Normal(count, 1.0f, static_cast<uint32_t>(count)));
  }
}

TEST(Float32PackingTest, SpecialValuesRoundTripBitExactly) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<uint32_t> v = {Bits(0.0f),
                             Bits(-0.0f),
                             Bits(inf),
                             Bits(-inf),
                             0x7fc00000u,  // quiet NaN
                             0xffc12345u,  // negative NaN with a payload
                             0x7f800001u,  // signalling NaN
                             0x00000001u,  // smallest subnormal
                             0x807fffffu,  // largest negative subnormal
                             Bits(std::numeric_limits<float>::max()),
                             Bits(std::numeric_limits<float>::min()),
                             Bits(1.0f),
                             Bits(-1.5f)};
  RoundTrip(v);
  // The same values inside blocks of otherwise narrow data, at every position of a block.
  for (size_t pos = 0; pos < 64; pos += 9) {
    std::vector<uint32_t> w = Normal(130, 1.0f, 7);
    for (size_t i = 0; i < v.size(); ++i) w[(pos + i * 11) % w.size()] = v[i];
    RoundTrip(w);
  }
}

TEST(Float32PackingTest, ZerosAndNegativeZerosTakeNoValueBytes) {
  std::vector<uint32_t> zeros(640, Bits(0.0f));
  // 10 blocks of 2 header bytes + an 8-byte zero mask.
  EXPECT_EQ(RoundTrip(zeros), kPackedFloat32HeaderBytes + 10 * 10);
  std::vector<uint32_t> mixed = Normal(640, 1.0f, 3);
  for (size_t i = 0; i < mixed.size(); i += 3) mixed[i] = Bits(i % 2 ? -0.0f : 0.0f);
  const size_t with_zeros = RoundTrip(mixed);
  EXPECT_LT(with_zeros, RoundTrip(Normal(640, 1.0f, 3)));
}

TEST(Float32PackingTest, NarrowExponentsPackSmallerAndNoiseFallsBackToRaw) {
  // A constant: width 0, so 2 header bytes and 3 mantissa bytes per value.
  std::vector<uint32_t> constant(6400, Bits(3.0f));
  EXPECT_EQ(RoundTrip(constant), kPackedFloat32HeaderBytes + 100 * 2 + 6400 * 3);
  // Normal values: exponents within ~16 binades per block, 4-5 bits instead of 8.
  const size_t normal = RoundTrip(Normal(1 << 16, 0.01f, 1));
  EXPECT_LT(normal, size_t{(1 << 16) * 4} * 9 / 10);
  EXPECT_GT(normal, size_t{(1 << 16) * 4} * 8 / 10);
  // Uniformly random bit patterns use every exponent: stored raw, 16 bytes over.
  std::mt19937 rng(5);
  std::vector<uint32_t> noise(5000);
  for (auto& x : noise) x = static_cast<uint32_t>(rng());
  EXPECT_EQ(RoundTrip(noise), kPackedFloat32HeaderBytes + 5000 * 4);
}

TEST(Float32PackingTest, BoundHoldsForTheWorstBlocks) {
  // Widest exponents, one zero (mask), one negative zero (second mask) per block.
  std::vector<uint32_t> v(64 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (static_cast<uint32_t>(i * 37 % 256) << 23) | 0x12345u;
  for (size_t b = 0; b < 5; ++b) {
    v[b * 64] = Bits(0.0f);
    v[b * 64 + 1] = Bits(-0.0f);
  }
  RoundTrip(v);  // checks the written size against the bound
}

class Float32PackingMalformedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    values_ = Normal(300, 1.0f, 11);
    values_[5] = Bits(0.0f);
    packed_ = Pack(values_);
  }
  absl::Status Unpack(const std::vector<uint8_t>& in, size_t count) {
    std::vector<uint32_t> out(count);
    return UnpackFloat32(in, absl::MakeSpan(out));
  }
  std::vector<uint32_t> values_;
  std::vector<uint8_t> packed_;
};

TEST_F(Float32PackingMalformedTest, EveryTruncationIsAnError) {
  for (size_t n = 0; n < packed_.size(); ++n) {
    std::vector<uint8_t> cut(packed_.begin(), packed_.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(Unpack(cut, values_.size()).ok()) << n;
  }
}

TEST_F(Float32PackingMalformedTest, HeaderErrorsSayWhatIsWrong) {
  std::vector<uint8_t> bad = packed_;
  bad[0] ^= 1;
  EXPECT_NE(Unpack(bad, values_.size()).message().find("bad magic"), std::string::npos);
  EXPECT_NE(Unpack(packed_, values_.size() + 1).message().find("holds 300 values, expected 301"),
            std::string::npos);
  bad = packed_;
  bad[4] = 7;
  EXPECT_NE(Unpack(bad, values_.size()).message().find("unknown format 7"), std::string::npos);
  bad = packed_;
  bad[8] += 1;  // one byte longer than the message: "left over"
  bad.push_back(0);
  EXPECT_NE(Unpack(bad, values_.size()).message().find("left over"), std::string::npos);
  bad = packed_;
  bad[kPackedFloat32HeaderBytes] = 0x49;  // width 9
  EXPECT_NE(Unpack(bad, values_.size()).message().find("block 0: bad flags"), std::string::npos);
}

// A message of `body` with a header stating `format`, `count` values and its own length.
std::vector<uint8_t> Message(uint32_t format, uint32_t count, const std::vector<uint8_t>& body) {
  const uint32_t header[4] = {0x46504347u /* "GCPF" */, format,
                              static_cast<uint32_t>(kPackedFloat32HeaderBytes + body.size()), count};
  std::vector<uint8_t> m(kPackedFloat32HeaderBytes);
  std::memcpy(m.data(), header, sizeof(header));
  m.insert(m.end(), body.begin(), body.end());
  return m;
}

// Every error UnpackFloat32 can return, each from the smallest message that causes it, with
// its message (the truncation test above only checks that some error comes).
TEST_F(Float32PackingMalformedTest, EachErrorIsNamed) {
  auto message_of = [&](const std::vector<uint8_t>& in, size_t count) {
    return std::string(Unpack(in, count).message());
  };
  using ::testing::HasSubstr;
  EXPECT_THAT(message_of({1, 2, 3}, 1), HasSubstr("3 bytes, shorter than its 16-byte header"));
  std::vector<uint8_t> longer = packed_;
  longer[9] = 0x7f;  // a length field of more than 32 KB
  EXPECT_THAT(message_of(longer, values_.size()), HasSubstr("states a length of"));
  EXPECT_THAT(message_of(Message(0, 3, std::vector<uint8_t>(11)), 3),
              HasSubstr("raw float32 message of 27 bytes for 3 values"));
  // Block 0 of packed_ has a zero (values_[5]), so a zero mask follows its two header bytes.
  const std::vector<uint8_t> block0(packed_.begin() + kPackedFloat32HeaderBytes, packed_.end());
  EXPECT_THAT(message_of(Message(1, 300, {block0.begin(), block0.begin() + 6}), 300),
              HasSubstr("block 0: masks run past the message"));
  EXPECT_THAT(message_of(Message(1, 300, {block0.begin(), block0.begin() + 11}), 300),
              HasSubstr("block 0: values run past the message"));
  EXPECT_THAT(message_of(Message(1, 3, {1}), 3), HasSubstr("block 0: header runs past the message"));
  // Three values, a zero mask naming value 5: outside the block.
  EXPECT_THAT(message_of(Message(1, 3, {0x10, 127, 0x20, 0, 0, 0, 0, 0, 0, 0}), 3),
              HasSubstr("block 0: zero masks name values outside the block or non-zeros"));
  // A negative-zero mask naming a value the zero mask does not.
  EXPECT_THAT(message_of(Message(1, 3, {0x30, 127, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0}), 3),
              HasSubstr("block 0: zero masks name values outside the block or non-zeros"));
}

TEST_F(Float32PackingMalformedTest, AnExponentAbove255IsAnError) {
  // A first block with exponents 0 and 255 has width 8 and base 0 (the narrow blocks after it
  // keep the message packed); raise its base.
  std::vector<uint32_t> v(64 * 4, 0x3f800000u);
  v[0] = 0x00000001u;  // subnormal: exponent 0
  v[1] = 0x7f800000u;  // infinity: exponent 255
  std::vector<uint8_t> p = Pack(v);
  ASSERT_EQ(p[kPackedFloat32HeaderBytes], 8);
  p[kPackedFloat32HeaderBytes + 1] = 1;
  std::vector<uint32_t> out(v.size());
  EXPECT_NE(UnpackFloat32(p, absl::MakeSpan(out)).message().find("above 255"), std::string::npos);
}

TEST_F(Float32PackingMalformedTest, RandomCorruptionNeverReadsOutOfBounds) {
  // Under ASan this is the check that matters: whatever the bytes, the decoder stays inside
  // the message and returns either an error or some values.
  std::mt19937 rng(9);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bad = packed_;
    const int flips = 1 + trial % 4;
    for (int f = 0; f < flips; ++f) {
      bad[kPackedFloat32HeaderBytes + rng() % (bad.size() - kPackedFloat32HeaderBytes)] ^=
          static_cast<uint8_t>(1u << (rng() % 8));
    }
    (void)Unpack(bad, values_.size());
  }
}

}  // namespace
}  // namespace gossipcc
