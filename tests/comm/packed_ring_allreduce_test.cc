// The packed ring (comm/gloo/packed_ring_allreduce.h, CommunicatorOptions::lossless_float32_allreduce)
// must return exactly the bits of the plain ring: each rank runs both, on two communicators
// over the same store, and compares. n = 1..8, every op, counts that make unequal chunks and
// segments, values with zeros, -0, subnormals and infinities; 64 MB on 4 ranks (16 MB under
// sanitizers) with several all-reduces in flight; the option agreed at creation; disagreements
// still fail cleanly.
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/core/store.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

// Gradient-like values of rank `rank`: a spread of magnitudes, runs of exact zeros (some
// negative), subnormals, and in `with_infinities` mode one infinity per rank.
std::vector<float> Values(int rank, size_t count, bool with_infinities) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    const double x = std::sin(0.37 * static_cast<double>(i) + rank) * std::exp(-static_cast<double>(i % 97) / 9.0);
    v[i] = static_cast<float>(x / 3.0);
    if ((i / 50) % 4 == 1) v[i] = (i + static_cast<size_t>(rank)) % 2 ? 0.0f : -0.0f;  // dead units
    if (i % 1009 == 7) v[i] = 1e-39f * static_cast<float>(rank + 1);                 // subnormal
  }
  if (with_infinities && count > 100) v[count / 2 + static_cast<size_t>(rank)] = std::numeric_limits<float>::infinity();
  return v;
}

CommunicatorOptions Packed(CommunicatorOptions options = {}) {
  options.lossless_float32_allreduce = true;
  return options;
}

// Rank `rank`'s plain and packed communicators, on one store.
struct Pair {
  std::unique_ptr<Communicator> plain, packed;
};
Pair Connect(int rank, int n, const std::shared_ptr<Store>& store) {
  Pair p;
  p.plain = Communicator::Create(std::make_shared<PrefixStore>("plain", store), rank, n);
  p.packed = Communicator::Create(std::make_shared<PrefixStore>("packed", store), rank, n, Packed());
  return p;
}

using Param = std::tuple<LaunchMode, int>;
class PackedRingTest : public ::testing::TestWithParam<Param> {
 protected:
  LaunchMode mode() const { return std::get<0>(GetParam()); }
  int n() const { return std::get<1>(GetParam()); }
};

// Counts: 0 and 1 (no ring), just above the direct line (chunks and segments of unequal
// length), and on up to 4 ranks chunks of three segments.
TEST_P(PackedRingTest, EveryOpAndSegmentationGivesThePlainRingsBits) {
  const int n = this->n();
  RunRanksWithStore(n, mode(), [n](int rank, std::shared_ptr<Store> store) {
    Pair comms = Connect(rank, n, store);
    std::vector<size_t> counts = {0, 1, kDirectAllreduceMaxBytes / sizeof(float) + 3};
    const size_t three_segments = (size_t{5} << 19) * static_cast<size_t>(n) / sizeof(float) + 2 * n + 1;
    if (n <= 4) counts.push_back(three_segments);
    // The float32 bytes this rank's packed ring must send: every chunk but its own finished one
    // (r + 1) in the reduce-scatter, every one but r + 2 in the all-gather.
    uint64_t expected_raw = 0;
    auto chunk = [&](size_t count, int c) { return count * (c + 1) / n - count * c / n; };
    for (size_t count : counts) {
      for (ReduceOp op : kOps) {
        // Every op on the short ring; on three segments per chunk (the sanitizers' slowest
        // case) sum and max: the layout is the same for every op. Under sanitizers sum alone,
        // with infinities: the same segments, slots and packing paths (TSan on a loaded 2-core
        // machine: 6-12 s for the whole case at n = 3 and 4, instead of 26-36 s).
        if (count == three_segments && op != ReduceOp::kSum && (kSanitizerBuild || op != ReduceOp::kMax)) continue;
        for (bool with_infinities : {false, true}) {
          if (count == three_segments && kSanitizerBuild && !with_infinities) continue;
          if (n > 1 && count > kDirectAllreduceMaxBytes / sizeof(float)) {
            expected_raw += 4 * (2 * count - chunk(count, (rank + 1) % n) - chunk(count, (rank + 2) % n));
          }
          const std::string what = absl::StrCat(ReduceOpName(op), " of ", count, " floats",
                                                with_infinities ? " with infinities" : "", " on rank ", rank);
          std::vector<float> want = Values(rank, count, with_infinities);
          std::vector<float> got = want;
          comms.plain->allreduce(CpuBuffer(want.data(), count), op)->wait();
          comms.packed->allreduce(CpuBuffer(got.data(), count), op)->wait();
          ASSERT_NO_FATAL_FAILURE(ExpectSameBits(want, got, what));
        }
      }
    }
    // The packed communicator did pack (else the comparisons above compared the plain ring
    // with itself), and the values took fewer bytes; the plain one packed nothing.
    const TrafficCounters plain = comms.plain->traffic(), packed = comms.packed->traffic();
    EXPECT_EQ(plain.packed_allreduce_raw_bytes, 0u);
    EXPECT_EQ(plain.packed_allreduce_wire_bytes, 0u);
    EXPECT_EQ(packed.packed_allreduce_raw_bytes, expected_raw);
    if (n > 1) {
      EXPECT_LT(packed.packed_allreduce_wire_bytes, packed.packed_allreduce_raw_bytes * 9 / 10);
    } else {
      EXPECT_EQ(packed.packed_allreduce_wire_bytes, 0u);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, PackedRingTest,
                         ::testing::ValuesIn(RankSweep()),  // every n; process mode at a few (harness.h)
                         ModeAndRanksName);

// 64 MB on 4 ranks: 16 segments (of at most 1 MiB) per chunk, 96 messages per rank, so each
// of the 8 send slots is reused 12 times and each of the 4 receive slots 24 times; three
// all-reduces in flight at once on the two lanes (DDP's buckets), then checked against the
// plain ring, and the sum of small integers checked exactly. Under sanitizers 16 MB: 4
// segments per chunk, 24 messages, each send slot still used 3 times and every wait on a slot's
// earlier send taken, in a quarter of the time (TSan took 76 s for 64 MB on an idle machine, and
// more than 120 s on a loaded one, where the old deadline fired).
TEST(PackedRingLargeTest, LargeWithSeveralInFlight) {
  const size_t bytes = kSanitizerBuild ? size_t{16} << 20 : size_t{64} << 20;
  // Safety nets, not speed checks: the slowest stage (TSan, 16 MB, on a 2-core machine under a
  // load of 10) took 19-26 s here, a plain build 7 s for 64 MB under the same load. The
  // collectives' timeout counts from their issue, and all of them are issued at once; the
  // harness deadline is above it, so a stalled ring fails with the communicator's report of
  // what it waits for.
  CommunicatorOptions options;
  options.timeout = std::chrono::seconds(300);
  const std::chrono::seconds deadline(600);
  RunRanksWithStore(4, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    Pair comms;
    comms.plain = Communicator::Create(std::make_shared<PrefixStore>("plain", store), rank, 4, options);
    comms.packed = Communicator::Create(std::make_shared<PrefixStore>("packed", store), rank, 4, Packed(options));
    const size_t count = bytes / sizeof(float);
    std::vector<float> a = Values(rank, count, false), b(count), c(count / 3 + 11);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i % 1000) * (rank + 1));
    for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 7) - 3.0f;
    std::vector<float> a_plain = a;
    auto wa = comms.packed->allreduce(CpuBuffer(a.data(), a.size()), ReduceOp::kAvg);
    auto wb = comms.packed->allreduce(CpuBuffer(b.data(), b.size()), ReduceOp::kSum);
    auto wc = comms.packed->allreduce(CpuBuffer(c.data(), c.size()), ReduceOp::kMax);
    comms.plain->allreduce(CpuBuffer(a_plain.data(), a_plain.size()), ReduceOp::kAvg)->wait();
    wa->wait();
    wb->wait();
    wc->wait();
    const std::string what = absl::StrCat(bytes >> 20, " MB");
    ASSERT_NO_FATAL_FAILURE(ExpectSameBits(a_plain, a, what + " avg"));
    for (size_t i = 0; i < count; ++i) {
      if (b[i] != static_cast<float>((i % 1000) * 10)) FAIL() << what << " sum, index " << i << ": " << b[i];
    }
    for (size_t i = 0; i < c.size(); ++i) {
      if (c[i] != static_cast<float>(i % 7) - 3.0f) FAIL() << "max, index " << i << ": " << c[i];
    }
  }, deadline);
}

// verify_collectives = false: no signature check, so the ring sends its first segments at
// once (RunOverlappedCheck does nothing); still the plain ring's bits.
TEST(PackedRingOptionTest, WithoutTheSignatureCheckStillThePlainRingsBits) {
  RunRanksWithStore(3, LaunchMode::kThreads, [](int rank, std::shared_ptr<Store> store) {
    CommunicatorOptions unchecked;
    unchecked.verify_collectives = false;
    auto plain = Communicator::Create(std::make_shared<PrefixStore>("plain", store), rank, 3, unchecked);
    auto packed = Communicator::Create(std::make_shared<PrefixStore>("packed", store), rank, 3, Packed(unchecked));
    for (size_t count : {kDirectAllreduceMaxBytes / sizeof(float) + 3, size_t{3} << 20}) {
      std::vector<float> want = Values(rank, count, false), got = want;
      plain->allreduce(CpuBuffer(want.data(), count), ReduceOp::kSum)->wait();
      packed->allreduce(CpuBuffer(got.data(), count), ReduceOp::kSum)->wait();
      ASSERT_NO_FATAL_FAILURE(ExpectSameBits(want, got, absl::StrCat("unchecked sum of ", count, " floats")));
    }
  });
}

TEST(PackedRingOptionTest, RanksThatDisagreeFailAtCreation) {
  ExpectCreateFailsOnEveryRank(
      3, [](int rank) { return rank == 1 ? Packed() : CommunicatorOptions{}; }, "lossless_float32_allreduce",
      [](int rank) {
        return std::string(rank == 1 ? "is true here but false on rank(s) 0, 2;" : "is false here but true on rank(s) 1;");
      });
}

// Disagreements are caught by the signature check while the first packed segments are in
// flight (as on the plain ring, errors_test.cc): every rank fails, no buffer is touched, and
// the next all-reduce is exact.
TEST(PackedRingErrorsTest, DisagreementsFailEveryRankAndLeaveTheBuffersAlone) {
  for (int ranks : {2, 4}) {
    RunRanks(ranks, LaunchMode::kThreads, [](Communicator& comm) {
      const int me = comm.rank();
      const int n = comm.size();
      const int odd = n - 1;
      const size_t ring = kDirectAllreduceMaxBytes / sizeof(float) + 5;
      std::vector<float> data(ring + 1, 1.0f);
      auto check = [&](const std::shared_ptr<Work>& w, const std::string& expected, const std::string& what) {
        try {
          w->wait();
          ADD_FAILURE() << what << ": no error";
        } catch (const MismatchError& e) {
          EXPECT_THAT(std::string(e.what()), HasSubstr(expected)) << what;
        }
        for (size_t i = 0; i < data.size(); ++i) {
          ASSERT_EQ(data[i], 1.0f) << what << ": element " << i << " of rank " << me << " was modified";
        }
        std::vector<float> v(ring, static_cast<float>(me + 1));
        comm.allreduce(CpuBuffer(v.data(), v.size()))->wait();
        for (size_t i = 0; i < v.size(); ++i) {
          ASSERT_EQ(v[i], static_cast<float>(n * (n + 1) / 2)) << "after " << what << ": element " << i;
        }
      };
      check(comm.allreduce(CpuBuffer(data.data(), me == odd ? ring + 1 : ring)),
            absl::StrCat("rank ", odd, ": ", ring + 1), "count");
      check(comm.allreduce(CpuBuffer(data.data(), ring), me == odd ? ReduceOp::kMax : ReduceOp::kSum), "reduce op",
            "op");
      // int32 takes the plain ring even with the option on: the dtype check still comes first.
      std::vector<int32_t> ints(ring, 1);
      check(me == odd ? comm.allreduce(CpuBuffer(ints.data(), ring)) : comm.allreduce(CpuBuffer(data.data(), ring)),
            absl::StrCat("rank ", odd, ": int32"), "dtype");
    }, Packed());
  }
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
