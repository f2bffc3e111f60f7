// The quantized all-reduce (compression/quantized_allreduce.h) against a reference computed here, written
// independently of the library's codec (std::nearbyint, element by element):
//  - every rank's result has exactly the reference's bits (so identical bits on every rank), for
//    n = 1..8, 8 and 4 bits, sum and average, counts 0, 1, around the block size and up to 6 MB
//    (and 16 MB, more than one slice, on 2 and 3 ranks);
//  - the result is within the header's error bound of the exact sum/average (computed in double);
//  - error feedback: over 1000 calls the running sum of outputs stays within a fixed bound of the
//    running sum of exact averages (without feedback the same inputs drift far beyond it);
//  - bad input (bits, block size, op, dtype, counts, a CUDA buffer, either residual; on one rank or
//    all): the same clear error on every rank, nothing modified, the communicator usable afterwards.
#include "compression/quantized_allreduce.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "comm/core/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {
using ::testing::HasSubstr;

// Rank `rank`'s input: block maxima spread over several binades, signs mixed, some exact zeros,
// a few zero blocks; `seed` varies it from call to call.
std::vector<float> Input(int rank, size_t count, int seed = 0) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    const double phase = 0.61 * static_cast<double>(i) + 1.7 * rank + 0.29 * seed;
    const double magnitude = std::ldexp(1.0, static_cast<int>((i / 256 + rank) % 9) - 4);
    v[i] = static_cast<float>(magnitude * std::sin(phase) * (1.0 + 0.25 * std::cos(3.1 * phase)));
    if (i % 37 == 5) v[i] = 0.0f;
    if ((i / 256) % 11 == 3) v[i] = 0.0f;  // a zero block
  }
  return v;
}

// ---- the reference, element by element ----------------------------------------------------
int Levels(int bits) { return bits == 8 ? 127 : 7; }

// x quantized and dequantized as one block: scale M / Q, q = nearbyint(x * (Q / M)).
void RoundTrip(const float* x, size_t len, int bits, float* out) {
  float m = 0.0f;
  bool finite = true;
  for (size_t i = 0; i < len; ++i) {
    finite = finite && std::isfinite(x[i]);
    m = std::max(m, std::fabs(x[i]));
  }
  if (!finite) {
    for (size_t i = 0; i < len; ++i) out[i] = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (m < 0x1p-100f) {
    for (size_t i = 0; i < len; ++i) out[i] = 0.0f;
    return;
  }
  const float q_levels = static_cast<float>(Levels(bits));
  const float scale = m / q_levels;
  const float inverse = q_levels / m;
  for (size_t i = 0; i < len; ++i) {
    // The wire carries integers: a negative value that rounds to 0 comes back as +0.
    const int q = static_cast<int>(std::min(q_levels, std::max(-q_levels, std::nearbyint(x[i] * inverse))));
    out[i] = scale * static_cast<float>(q);
  }
}

std::vector<float> Reference(const std::vector<std::vector<float>>& inputs, int bits, size_t block, ReduceOp op) {
  const size_t count = inputs[0].size();
  const int n = static_cast<int>(inputs.size());
  std::vector<float> out(count), d(block), s(block);
  for (size_t start = 0; start < count; start += block) {
    const size_t len = std::min(block, count - start);
    for (int r = 0; r < n; ++r) {
      RoundTrip(inputs[r].data() + start, len, bits, d.data());
      for (size_t i = 0; i < len; ++i) s[i] = r == 0 ? d[i] : s[i] + d[i];
    }
    if (op == ReduceOp::kAvg) {
      for (size_t i = 0; i < len; ++i) s[i] /= static_cast<float>(n);
    }
    RoundTrip(s.data(), len, bits, out.data() + start);
  }
  return out;
}

// max over elements of |got - exact| / bound (<= 1 passes), exact and bound in double.
double WorstBoundRatio(const std::vector<std::vector<float>>& inputs, const std::vector<float>& got, int bits,
                       size_t block, ReduceOp op) {
  const size_t count = got.size();
  const int n = static_cast<int>(inputs.size());
  double worst = 0.0;
  for (size_t start = 0; start < count; start += block) {
    const size_t len = std::min(block, count - start);
    double maxima = 0.0;
    for (int r = 0; r < n; ++r) {
      double m = 0.0;
      for (size_t i = 0; i < len; ++i) m = std::max(m, std::fabs(static_cast<double>(inputs[r][start + i])));
      maxima += m;
    }
    const double bound = QuantizedAllreduceErrorBound(bits, n, maxima, op);
    for (size_t i = start; i < start + len; ++i) {
      double exact = 0.0;
      for (int r = 0; r < n; ++r) exact += inputs[r][i];
      if (op == ReduceOp::kAvg) exact /= n;
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - exact) / bound);
    }
  }
  return worst;
}

// ---- the codec alone ------------------------------------------------------------------------
TEST(QuantizedCodecTest, RoundTripMatchesTheReferenceAndPacksNibbles) {
  for (int bits : {8, 4}) {
    for (size_t len : {1u, 2u, 7u, 255u, 256u}) {
      std::vector<float> x = Input(1, len, 3), want(len), got(len);
      x[len / 2] = -3.0f;  // the block maximum, negative
      std::vector<uint8_t> bytes(QuantizedBytes(len, bits, 256));
      EXPECT_EQ(bytes.size(), 4 + (bits == 8 ? len : (len + 1) / 2));
      quantized_internal::QuantizeBlock(x.data(), len, bits, bytes.data(), nullptr);
      quantized_internal::DequantizeBlock(bytes.data(), len, bits, got.data());
      RoundTrip(x.data(), len, bits, want.data());
      ExpectSameBits(want, got, "bits " + std::to_string(bits) + ", len " + std::to_string(len));
      EXPECT_EQ(got[len / 2], -3.0f);  // the maximum is a level: exact
      for (size_t i = 0; i < len; ++i) EXPECT_LE(std::fabs(got[i] - x[i]), 3.0 / (2 * Levels(bits)) * (1 + 1e-5));
    }
  }
  // 4 bits: -7 and 7 at elements 0 and 1 of a block with maximum 7 -> nibbles 0x9 and 0x7.
  const float x[2] = {-7.0f, 7.0f};
  uint8_t bytes[5];
  quantized_internal::QuantizeBlock(x, 2, 4, bytes, nullptr);
  EXPECT_EQ(bytes[4], 0x79);
}

TEST(QuantizedCodecTest, NonFiniteBlocksBecomeNaNAndTinyBlocksZero) {
  std::vector<float> x(10, 1.0f), out(10);
  x[3] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> bytes(QuantizedBytes(10, 8, 256));
  quantized_internal::QuantizeBlock(x.data(), 10, 8, bytes.data(), nullptr);
  quantized_internal::DequantizeBlock(bytes.data(), 10, 8, out.data());
  for (float v : out) EXPECT_TRUE(std::isnan(v));
  std::vector<float> tiny(10, 1e-35f), residual(10, 0.0f);
  tiny[0] = 1e-40f;  // subnormal
  quantized_internal::QuantizeBlock(tiny.data(), 10, 4, bytes.data(), residual.data());
  quantized_internal::DequantizeBlock(bytes.data(), 10, 4, out.data());
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(out[i], 0.0f);
    EXPECT_EQ(residual[i], tiny[i]);  // kept for the next call
  }
}

TEST(QuantizedCodecTest, SizesAndOwnershipCoverTheBufferOnce) {
  EXPECT_EQ(QuantizedBytes(0, 8, 256), 0u);
  EXPECT_EQ(QuantizedBytes(257, 8, 256), 260u + 5u);
  EXPECT_EQ(QuantizedBytes(257, 4, 256), 132u + 5u);
  EXPECT_EQ(QuantizedBytes(3, 4, 256), 4u + 2u);
  for (int n = 1; n <= 8; ++n) {
    // Under a sanitizer half the rank counts (InSanitizerRankCounts): the loop below touches
    // every element of two slices, and the ranges' arithmetic is the same at every n.
    if (!InSanitizerRankCounts(n)) continue;
    for (size_t count : {size_t{0}, size_t{1}, size_t{300}, size_t{256} * 8 + 1, kQuantizedSliceElements * 2 + 700}) {
      // Every element owned by exactly one rank, in whole blocks.
      std::vector<int> owners(count, 0);
      for (int r = 0; r < n; ++r) {
        for (const auto& [b, e] : QuantizedOwnedRanges(count, 256, r, n)) {
          EXPECT_LT(b, e);
          EXPECT_TRUE(b % 256 == 0);
          EXPECT_TRUE(e % 256 == 0 || e == count);
          for (size_t i = b; i < e; ++i) ++owners[i];
        }
      }
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(owners[i], 1) << i;
    }
  }
}

// ---- the collective -------------------------------------------------------------------------
class QuantizedAllreduceTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
};

struct Case {
  size_t count;
  int bits;
  ReduceOp op;
  size_t block;
};

TEST_P(QuantizedAllreduceTest, EveryRankGetsTheReferenceBitsWithinTheBound) {
  const int n = this->n();
  std::vector<Case> cases;
  for (int bits : {8, 4}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{256} * 8 * 3 + 17,
                           size_t{100003}}) {
        cases.push_back({count, bits, op, 256});
      }
    }
  }
  cases.push_back({1001, 4, ReduceOp::kAvg, 7});     // odd block: 4-bit blocks end in half a byte
  cases.push_back({200003, 4, ReduceOp::kAvg, 7});   // the same, large enough to gather in a ring
  cases.push_back({5000, 8, ReduceOp::kSum, 1024});
  // Several MB: 6 MB on up to 4 ranks, 2 MB above (and under sanitizers).
  const size_t large = (n <= 4 && !kSanitizerBuild ? size_t{6} : size_t{2}) << 18;  // elements
  cases.push_back({large + 3, 8, ReduceOp::kAvg, 256});
  cases.push_back({large + 3, 4, ReduceOp::kSum, 256});
  // More than one slice (16 MB and a bit): the rounds of a second slice, in which (2 blocks) some
  // ranks own nothing and send or receive nothing in some rounds.
  if ((n == 2 || n == 3) && !kSanitizerBuild) cases.push_back({kQuantizedSliceElements + 300, 8, ReduceOp::kAvg, 256});

  // Every case's inputs and reference first, then all cases on one set of communicators (one
  // RunRanks): a RunRanks per case spent most of this test's time (about 0.75 s per case at n 8,
  // in the plain build as under TSan) setting up and tearing down n communicators, not in the
  // quantized all-reduce.
  struct Prepared {
    Case c;
    std::string what;
    std::vector<std::vector<float>> inputs;
    std::vector<float> want;
  };
  std::vector<Prepared> prepared;
  for (const Case& c : cases) {
    Prepared p{c, "n " + std::to_string(n) + ", count " + std::to_string(c.count) + ", bits " + std::to_string(c.bits) +
                      ", " + ReduceOpName(c.op) + ", block " + std::to_string(c.block),
               {}, {}};
    for (int r = 0; r < n; ++r) p.inputs.push_back(Input(r, c.count));
    p.want = Reference(p.inputs, c.bits, c.block, c.op);
    if (c.count) {
      const double ratio = WorstBoundRatio(p.inputs, p.want, c.bits, c.block, c.op);
      EXPECT_LE(ratio, 1.0) << p.what << ": the reference exceeds the stated bound";
      if (c.count >= 255) {
        EXPECT_GT(ratio, 0.05) << p.what << ": the bound is far from tight";
      }
    }
    prepared.push_back(std::move(p));
  }
  // Every other case runs on a scratch kept across the cases (QuantizedAllreduceScratch), so its
  // buffers are reused at other sizes, larger and smaller, with the last call's bytes in them;
  // the others allocate their own. Both must give the reference bits.
  RunRanks(n, LaunchMode::kThreads, [&](Communicator& comm) {
    QuantizedAllreduceScratch scratch;
    for (size_t i = 0; i < prepared.size(); ++i) {
      const Prepared& p = prepared[i];
      const bool kept = i % 2 == 0 || p.c.count > kQuantizedSliceElements;  // (and the case of two slices)
      const std::string what =
          p.what + ", rank " + std::to_string(comm.rank()) + (kept ? ", kept scratch" : ", own scratch");
      std::vector<float> x = p.inputs[comm.rank()];
      QuantizedAllreduceOptions o;
      o.bits = p.c.bits;
      o.op = p.c.op;
      o.block_size = p.c.block;
      const QuantizedAllreduceStats stats =
          QuantizedAllreduce(comm, CpuBuffer(x.data(), x.size()), o, {}, kept ? &scratch : nullptr);
      EXPECT_EQ(stats.quantized_bytes, QuantizedBytes(p.c.count, p.c.bits, p.c.block)) << what;
      // A mismatch fails the case and goes on to the next (the lambda confines ExpectSameBits'
      // fatal assertion), so the ranks stay in step for the collectives that follow.
      [&] { ExpectSameBits(p.want, x, what); }();
    }
  });
}

// Non-finite values on one rank: that block is NaN on every rank, the others are unaffected.
TEST_P(QuantizedAllreduceTest, ANonFiniteValuePoisonsItsBlockOnly) {
  const int n = this->n();
  const size_t count = 256 * 3;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(Input(r, count, 1));
  inputs[n - 1][300] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> want = Reference(inputs, 8, 256, ReduceOp::kAvg);
  RunRanks(n, LaunchMode::kThreads, [&](Communicator& comm) {
    std::vector<float> x = inputs[comm.rank()];
    QuantizedAllreduce(comm, CpuBuffer(x.data(), x.size()), {});
    ExpectSameBits(want, x, "rank " + std::to_string(comm.rank()));
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(std::isnan(x[i]), i / 256 == 1) << i;
  });
}

// n = 1..8; under a sanitizer its half of them (InSanitizerRankCounts in harness.h).
std::vector<int> RankCounts() {
  std::vector<int> out;
  for (int n = 1; n <= 8; ++n) {
    if (InSanitizerRankCounts(n)) out.push_back(n);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Ranks, QuantizedAllreduceTest, ::testing::ValuesIn(RankCounts()),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

// Processes instead of threads (the harness's other mode), on 3 ranks.
TEST(QuantizedAllreduceProcessesTest, SameBitsAcrossProcesses) {
  const int n = 3;
  const size_t count = 256 * 40 + 5;
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(Input(r, count, 2));
  const std::vector<float> want = Reference(inputs, 4, 256, ReduceOp::kAvg);
  RunRanks(n, LaunchMode::kProcesses, [&](Communicator& comm) {
    std::vector<float> x = inputs[comm.rank()];
    QuantizedAllreduceOptions o;
    o.bits = 4;
    QuantizedAllreduce(comm, CpuBuffer(x.data(), x.size()), o);
    ExpectSameBits(want, x, "rank " + std::to_string(comm.rank()));
  });
}

// ---- error feedback ---------------------------------------------------------------------------
// Inputs that nearest rounding biases: every block has maximum 1 (element 0), the rest sit near
// 0.3 + 0.02 * rank, between two levels; the same every call but for a little noise. Over K calls the running sum
// of outputs minus the running sum of exact averages is then (average of the ranks' last
// residuals) + (the owner's last residual), at most about one quantization step whatever K:
// checked against a fixed bound C at every 100th call up to 1000. Without feedback the same
// inputs drift by the rounding bias every call and leave C behind.
struct Drift {
  double worst = 0.0;          // max over checkpoints and elements of |running sums' difference|
  double at_100 = 0.0, at_1000 = 0.0;
  double bound = 0.0;          // C
};

Drift RunDrift(Communicator& comm, int bits, bool feedback) {
  const size_t count = 1000;  // 3 full blocks and one of 232
  const int n = comm.size();
  QuantizedAllreduceOptions o;
  o.bits = bits;
  QuantizedErrorFeedback ef(o);
  std::vector<double> sum_out(count, 0.0), sum_exact(count, 0.0);
  // C: twice the per-call bound of these inputs' block maxima (1 on every rank).
  Drift d;
  d.bound = 2.0 * QuantizedAllreduceErrorBound(bits, n, static_cast<double>(n), ReduceOp::kAvg);
  auto value = [](int r, size_t i, int k) {
    if (i % 256 == 0) return 1.0f;
    return static_cast<float>(0.3 + 0.02 * r + 0.01 * std::sin(0.7 * i + 1.3 * k + r));
  };
  std::vector<float> x(count);
  for (int k = 1; k <= 1000; ++k) {
    for (size_t i = 0; i < count; ++i) {
      x[i] = value(comm.rank(), i, k);
      double exact = 0.0;
      for (int r = 0; r < n; ++r) exact += value(r, i, k);
      sum_exact[i] += exact / n;
    }
    if (feedback) {
      ef.AllReduce(comm, "the key", CpuBuffer(x.data(), count));
    } else {
      QuantizedAllreduce(comm, CpuBuffer(x.data(), count), o);
    }
    for (size_t i = 0; i < count; ++i) sum_out[i] += x[i];
    if (k % 100 == 0) {
      double worst = 0.0;
      for (size_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(sum_out[i] - sum_exact[i]));
      d.worst = std::max(d.worst, worst);
      if (k == 100) d.at_100 = worst;
      if (k == 1000) d.at_1000 = worst;
    }
  }
  return d;
}

TEST(QuantizedErrorFeedbackTest, RunningSumStaysWithinAFixedBoundOver1000Calls) {
  for (int n : {2, 3}) {
    for (int bits : {4, 8}) {
      // Sanitizer builds (5-15x slower) run one of the four each: AddressSanitizer 2 ranks at 4
      // bits, ThreadSanitizer 3 ranks at 8 (with FullSuite(), both of these in each).
      if (kSanitizerBuild && (n == 2) != (bits == 4)) continue;
      if (kSanitizerBuild && !FullSuite() && (kAddressSanitizerBuild ? n != 2 : n != 3)) continue;
      RunRanks(n, LaunchMode::kThreads, [&](Communicator& comm) {
        const Drift with = RunDrift(comm, bits, true);
        const Drift without = RunDrift(comm, bits, false);
        const std::string what = "n " + std::to_string(n) + ", bits " + std::to_string(bits) + ", rank " +
                                 std::to_string(comm.rank());
        EXPECT_LE(with.worst, with.bound) << what << ": with feedback, at 100 calls " << with.at_100 << ", at 1000 "
                                          << with.at_1000;
        EXPECT_GT(without.at_1000, 10 * with.bound) << what << ": without feedback the drift should grow";
        EXPECT_GT(without.at_1000, 5 * without.at_100) << what;
        if (comm.rank() == 0) {
          std::printf("n %d bits %d: |running sum error| with feedback %.3g (100 calls) %.3g (1000), bound %.3g; "
                      "without %.3g (100) %.3g (1000)\n",
                      n, bits, with.at_100, with.at_1000, with.bound, without.at_100, without.at_1000);
        }
      });
    }
  }
}

TEST(QuantizedErrorFeedbackTest, StateIsKeptPerKeyAndRestartsOnANewSize) {
  RunRanks(2, LaunchMode::kThreads, [&](Communicator& comm) {
    QuantizedErrorFeedback ef;
    std::vector<float> a = Input(comm.rank(), 600, 1), b = Input(comm.rank(), 300, 2);
    ef.AllReduce(comm, "a", CpuBuffer(a.data(), a.size()));
    ef.AllReduce(comm, "b", CpuBuffer(b.data(), b.size()));
    ASSERT_NE(ef.state("a"), nullptr);
    EXPECT_EQ(ef.state("a")->sent.size(), 600u);
    EXPECT_EQ(ef.state("b")->sent.size(), 300u);
    EXPECT_EQ(ef.state("c"), nullptr);
    // The owner's residual is written in the owned range only.
    const auto ranges = QuantizedOwnedRanges(600, 256, comm.rank(), 2);
    ASSERT_EQ(ranges.size(), 1u);
    const auto& owned = ef.state("a")->owned;
    for (size_t i = 0; i < 600; ++i) {
      if (i < ranges[0].first || i >= ranges[0].second) {
        EXPECT_EQ(owned[i], 0.0f) << i;
      }
    }
    // A saved state restored into a fresh object gives the same next result.
    QuantizedErrorFeedback restored;
    restored.set_state("a", *ef.state("a"));
    std::vector<float> x = Input(comm.rank(), 600, 5), y = x;
    ef.AllReduce(comm, "a", CpuBuffer(x.data(), x.size()));
    restored.AllReduce(comm, "a", CpuBuffer(y.data(), y.size()));
    ExpectSameBits(x, y, "restored state");
    std::vector<float> c(700, 1.0f);
    ef.AllReduce(comm, "a", CpuBuffer(c.data(), c.size()));
    EXPECT_EQ(ef.state("a")->sent.size(), 700u);
  });
}

TEST(QuantizedErrorFeedbackTest, SetStateRefusesResidualsOfDifferentSizes) {
  QuantizedErrorFeedback ef;
  QuantizedErrorFeedback::State bad;
  bad.sent.assign(10, 0.0f);
  bad.owned.assign(9, 0.0f);
  try {
    ef.set_state("w", bad);
    ADD_FAILURE() << "set_state accepted sent of 10 and owned of 9 elements";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("sent has 10 elements, owned 9"));
  }
  EXPECT_EQ(ef.state("w"), nullptr);
}

// ---- a peer that leaves mid-call ----------------------------------------------------------------
// Rank 2 plays its part by hand up to the ring gather (the header, then its two scatter rounds
// with bytes of the right sizes), waits until rank 1's first gather piece reaches it (so both
// other ranks are inside the ring gather), and leaves. Ranks 0 and 1 must fail with a CommError
// well within a safety net (their timeout is 2 s), and the communicator must refuse later calls;
// under ASan this also checks that no posted receive outlives the memory it writes to (the
// call hands its buffers to the communicator). The header's layout is the collective's own
// (quantized_allreduce.cc): this test fails loudly (a MismatchError) if that layout changes.
TEST(QuantizedAllreduceFailureTest, APeerThatLeavesInTheRingGatherFailsTheOthersPromptly) {
  const int n = 3;
  const size_t count = 256 * 300;  // 300 blocks: 78 KB quantized at 8 bits, so the gather is the ring
  ASSERT_GT(QuantizedBytes(count, 8, 256), kQuantizedEagerBytes);
  CommunicatorOptions quick;
  quick.timeout = std::chrono::milliseconds(2000);
  quick.rendezvous_timeout = std::chrono::seconds(60);  // a safety net: connecting may be slow
  RunRanks(n, LaunchMode::kThreads, [&](Communicator& comm) {
    const int me = comm.rank();
    if (me == 2) {
      const int64_t header[8] = {0x51415231, static_cast<int64_t>(DType::kFloat32), static_cast<int64_t>(count), 8,
                                 256, static_cast<int64_t>(ReduceOp::kAvg), 0, 0};
      std::vector<int64_t> table(8 * n);
      comm.allgather(CpuBuffer(header, 8), CpuBuffer(table.data(), table.size()))->wait();
      auto region_bytes = [&](int owner) {
        const auto ranges = QuantizedOwnedRanges(count, 256, owner, n);
        return QuantizedBytes(ranges.at(0).second - ranges.at(0).first, 8, 256);
      };
      std::vector<uint8_t> to0(region_bytes(0), 0), to1(region_bytes(1), 0), from1(region_bytes(2)),
          from0(region_bytes(2)), gathered(region_bytes(1));
      // Round 1: to rank 0, from rank 1; round 2: to rank 1, from rank 0 (all-zero blocks).
      comm.p2p({P2POp::Send(CpuBuffer(to0.data(), to0.size()), 0, kQuantizedAllreduceTag),
                P2POp::Recv(CpuBuffer(from1.data(), from1.size()), 1, kQuantizedAllreduceTag)})
          ->wait();
      comm.p2p({P2POp::Send(CpuBuffer(to1.data(), to1.size()), 1, kQuantizedAllreduceTag),
                P2POp::Recv(CpuBuffer(from0.data(), from0.size()), 0, kQuantizedAllreduceTag)})
          ->wait();
      comm.recv(CpuBuffer(gathered.data(), gathered.size()), 1, kQuantizedAllreduceTag)->wait();
      comm.shutdown();  // closes its connections, as a crashed peer's kernel would
      return;
    }
    std::vector<float> x = Input(me, count);
    const auto start = std::chrono::steady_clock::now();
    try {
      QuantizedAllreduce(comm, CpuBuffer(x.data(), x.size()), {});
      ADD_FAILURE() << "rank " << me << ": the call succeeded without rank 2";
    } catch (const CommError& e) {
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      // Rank 0's ring receive is from rank 2 (its scatter receive from rank 2 was round 1, which
      // rank 2 completed): the failure surfaces in the ring gather.
      EXPECT_THAT(e.what(), HasSubstr(me == 0 ? "from rank 2" : "on rank 1 of 3"));
      // A safety net 15x the timeout, not a speed check.
      EXPECT_LT(took.count(), 30000) << "rank " << me << " took " << took.count() << " ms to fail: " << e.what();
    }
    try {
      QuantizedAllreduce(comm, CpuBuffer(x.data(), x.size()), {});
      ADD_FAILURE() << "rank " << me << ": a call after the failure succeeded";
    } catch (const AbortedError&) {
    } catch (const CommError& e) {
      ADD_FAILURE() << "rank " << me << ": expected AbortedError after the failure, got: " << e.what();
    }
  }, quick);
}

// ---- bad input ----------------------------------------------------------------------------------
TEST(QuantizedAllreduceBadInputTest, NullDataWithElementsFailsOnEveryRank) {
  RunRanks(2, LaunchMode::kThreads, [&](Communicator& comm) {
    std::vector<float> x(10, 1.0f);
    const Buffer data = comm.rank() == 1 ? Buffer{nullptr, 10, DType::kFloat32, Device::CPU()}
                                         : CpuBuffer(x.data(), x.size());
    try {
      QuantizedAllreduce(comm, data, {});
      ADD_FAILURE() << "rank " << comm.rank() << ": no error";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 1: data is null with 10 elements"));
    }
    for (float v : x) EXPECT_EQ(v, 1.0f);
  });
}

// A CUDA buffer handed to this CPU collective (here a host pointer labelled cuda:0, which it
// never dereferences): on one rank or on all, every rank raises the same InvalidArgumentError
// before anything moves, and nothing is modified.
TEST(QuantizedAllreduceBadInputTest, ACudaBufferFailsOnEveryRank) {
  RunRanks(3, LaunchMode::kThreads, [&](Communicator& comm) {
    for (bool everywhere : {false, true}) {
      std::vector<float> x = Input(comm.rank(), 1000), x0 = x;
      const bool cuda = everywhere || comm.rank() == 1;
      const Buffer data = cuda ? Buffer{x.data(), x.size(), DType::kFloat32, Device::CUDA(0)}
                               : CpuBuffer(x.data(), x.size());
      try {
        QuantizedAllreduce(comm, data, {});
        ADD_FAILURE() << "rank " << comm.rank() << ": no error";
      } catch (const InvalidArgumentError& e) {
        EXPECT_THAT(e.what(), HasSubstr("rank 1: only CPU buffers are supported, got a CUDA buffer"));
        EXPECT_THAT(e.what(), HasSubstr("nothing was modified"));
        if (everywhere) {
          EXPECT_THAT(e.what(), HasSubstr("rank 0: only CPU buffers are supported"));
        } else {
          EXPECT_THAT(e.what(), HasSubstr("ranks disagree on the device: rank 0: cpu, rank 1: cuda, rank 2: cpu"));
        }
      }
      ExpectSameBits(x0, x, "data modified");
    }
    // Still usable.
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < 3; ++r) inputs.push_back(Input(r, 300));
    std::vector<float> y = inputs[comm.rank()];
    QuantizedAllreduce(comm, CpuBuffer(y.data(), y.size()), {});
    ExpectSameBits(Reference(inputs, 8, 256, ReduceOp::kAvg), y, "after the errors");
  });
}

struct BadCase {
  std::string name;
  // Sets up rank r's call: options, and whether to pass float64 / a different count / bad residuals.
  std::function<void(int r, QuantizedAllreduceOptions&, size_t& count, bool& float64, int& residual)> make;
  bool mismatch;  // MismatchError (else InvalidArgumentError)
  std::string words;
};

TEST(QuantizedAllreduceBadInputTest, EveryRankFailsAlikeAndNothingIsModified) {
  const int n = 3;
  const std::vector<BadCase> cases = {
      {"bits 3 on rank 1", [](int r, auto& o, auto&, auto&, auto&) { if (r == 1) o.bits = 3; }, false,
       "rank 1: bits must be 4 or 8, got 3"},
      {"bits 16 everywhere", [](int, auto& o, auto&, auto&, auto&) { o.bits = 16; }, false, "bits must be 4 or 8"},
      {"bits differ (both valid)", [](int r, auto& o, auto&, auto&, auto&) { o.bits = r == 2 ? 4 : 8; }, true,
       "ranks disagree on the bits: rank 0: 8, rank 1: 8, rank 2: 4"},
      {"count differs", [](int r, auto&, size_t& count, auto&, auto&) { if (r == 0) count = 999; }, true,
       "ranks disagree on the element count"},
      {"float64 on rank 2", [](int r, auto&, auto&, bool& f64, auto&) { f64 = r == 2; }, false,
       "rank 2: only float32 is supported, got float64"},
      {"block size differs", [](int r, auto& o, auto&, auto&, auto&) { o.block_size = 128 << r; }, true,
       "ranks disagree on the block size"},
      {"block size 0", [](int, auto& o, auto&, auto&, auto&) { o.block_size = 0; }, false, "block_size must be in"},
      {"op max", [](int, auto& o, auto&, auto&, auto&) { o.op = ReduceOp::kMax; }, false,
       "op must be sum or avg, got max"},
      {"residual too short on rank 0", [](int r, auto&, auto&, auto&, int& res) { res = r == 0 ? 2 : 1; }, false,
       "rank 0: the error-feedback residuals must"},
      {"owned residual too short on rank 1", [](int r, auto&, auto&, auto&, int& res) { res = r == 1 ? 3 : 1; },
       false, "rank 1: the error-feedback residuals must"},
      {"owned residual float64 on rank 2", [](int r, auto&, auto&, auto&, int& res) { res = r == 2 ? 4 : 1; }, false,
       "rank 2: the error-feedback residuals must both be float32 CPU buffers"},
      {"owned residual on a CUDA device on rank 0", [](int r, auto&, auto&, auto&, int& res) { res = r == 0 ? 5 : 1; },
       false, "rank 0: the error-feedback residuals must both be float32 CPU buffers"},
      {"owned residual missing on rank 1 (sent given)",
       [](int r, auto&, auto&, auto&, int& res) { res = r == 1 ? 6 : 1; }, false,
       "rank 1: the error-feedback residuals must"},
  };
  RunRanks(n, LaunchMode::kThreads, [&](Communicator& comm) {
    for (const BadCase& c : cases) {
      QuantizedAllreduceOptions o;
      size_t count = 1000;
      bool float64 = false;
      // 0: none, 1: right, 2: sent one element short, 3: owned one element short, 4: owned float64,
      // 5: owned on a CUDA device, 6: owned empty (sent given)
      int residual = 0;
      c.make(comm.rank(), o, count, float64, residual);
      std::vector<float> x = Input(comm.rank(), count), x0 = x;
      std::vector<double> xd(count, 1.5);
      std::vector<float> sent(count, 0.25f), owned(count, 0.5f);
      std::vector<double> owned64(count, 0.5);
      QuantizedResidual res;
      if (residual) {
        res.sent = CpuBuffer(sent.data(), residual == 2 ? count - 1 : count);
        res.owned = CpuBuffer(owned.data(), residual == 3 ? count - 1 : count);
        if (residual == 4) res.owned = CpuBuffer(owned64.data(), count);
        if (residual == 5) res.owned = Buffer{owned.data(), count, DType::kFloat32, Device::CUDA(0)};
        if (residual == 6) res.owned = Buffer{nullptr, 0, DType::kFloat32, Device::CPU()};
      }
      const Buffer data = float64 ? CpuBuffer(xd.data(), count) : CpuBuffer(x.data(), count);
      std::string error = "no error";
      try {
        QuantizedAllreduce(comm, data, o, res);
      } catch (const MismatchError& e) {
        error = std::string(c.mismatch ? "" : "[unexpected MismatchError] ") + e.what();
      } catch (const InvalidArgumentError& e) {
        error = std::string(c.mismatch ? "[unexpected InvalidArgumentError] " : "") + e.what();
      }
      EXPECT_THAT(error, HasSubstr(c.words)) << c.name << ", rank " << comm.rank();
      EXPECT_THAT(error, HasSubstr("nothing was modified")) << c.name;
      EXPECT_THAT(error, HasSubstr("on rank " + std::to_string(comm.rank()) + " of 3")) << c.name;
      EXPECT_THAT(error, ::testing::Not(HasSubstr("[unexpected"))) << c.name;
      ExpectSameBits(x0, x, c.name + ": data modified");
      for (double v : xd) EXPECT_EQ(v, 1.5) << c.name;
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(sent[i], 0.25f) << c.name;
        ASSERT_EQ(owned[i], 0.5f) << c.name;
        ASSERT_EQ(owned64[i], 0.5) << c.name;
      }
    }
    // Still usable.
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(Input(r, 1000));
    std::vector<float> x = inputs[comm.rank()];
    QuantizedAllreduce(comm, CpuBuffer(x.data(), x.size()), {});
    ExpectSameBits(Reference(inputs, 8, 256, ReduceOp::kAvg), x, "after the errors");
  });
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
