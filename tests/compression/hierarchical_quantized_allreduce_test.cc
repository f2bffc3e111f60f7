// HierarchicalQuantizedAllreduce (compression/hierarchical_quantized_allreduce.h) on H x G layouts:
//  - every rank's result has exactly the bits of the quantized all-reduce over H nodes whose
//    inputs are the host sums, computed here from the format's definition (std::nearbyint per
//    element; integer inputs, so that the exact host sums do not depend on the order of the
//    additions), for sum and, where dividing by G is exact, average; within the error bound
//    over H nodes of the exact result everywhere;
//  - error feedback: three calls equal the reference run with its residuals carried, element by
//    element on the rank that quantizes it; the residuals outside this rank's slice untouched;
//  - the bytes a host sends across (its G ranks together) within 10% of one rank's bytes in the
//    flat quantized all-reduce over H ranks, where the flat form over H x G ranks sends G times that;
//  - a NaN on one rank makes its block NaN everywhere; bad arguments on one rank and counts that
//    differ across hosts raise the same error on every rank, naming the rank, data untouched.
#include "compression/hierarchical_quantized_allreduce.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/core/store.h"
#include "comm/host_groups.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {
using ::testing::HasSubstr;

using Layout = HostLayout;

// Rank r's input at call `call`: integers in [-40, 40] (exact sums in float32), some zeros,
// whole zero blocks, block maxima that differ between blocks and ranks.
float Input(int rank, size_t i, int call = 0) {
  if ((i / 256) % 7 == 3) return 0.0f;
  const double v = std::sin(0.61 * static_cast<double>(i) + 1.7 * rank + 0.9 * call) * (10 + (i / 256 + rank) % 31);
  return static_cast<float>(std::nearbyint(v));
}

// ---- the reference: the quantized all-reduce over H nodes, from the format's definition ----
int Levels(int bits) { return bits == 8 ? 127 : 7; }

// x + residual quantized and dequantized as one block; residual <- what it lost (if given).
void RoundTrip(const float* x, float* residual, size_t len, int bits, float* out) {
  std::vector<float> v(x, x + len);
  if (residual) {
    for (size_t i = 0; i < len; ++i) v[i] += residual[i];
  }
  float m = 0.0f;
  bool finite = true;
  for (float e : v) {
    finite = finite && std::isfinite(e);
    m = std::max(m, std::fabs(e));
  }
  if (!finite || m < 0x1p-100f) {
    for (size_t i = 0; i < len; ++i) out[i] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  } else {
    const float q_levels = static_cast<float>(Levels(bits));
    const float scale = m / q_levels;
    const float inverse = q_levels / m;
    for (size_t i = 0; i < len; ++i) {
      const int q = static_cast<int>(std::min(q_levels, std::max(-q_levels, std::nearbyint(v[i] * inverse))));
      out[i] = scale * static_cast<float>(q);
    }
  }
  if (residual && finite) {
    for (size_t i = 0; i < len; ++i) residual[i] = v[i] - out[i];
  }
}

// One call over `inputs.size()` nodes; `sent` (per node) and `owned` (one: each block has one
// owner) null without error feedback.
std::vector<float> Reference(const std::vector<std::vector<float>>& inputs, int bits, size_t block, ReduceOp op,
                             std::vector<std::vector<float>>* sent = nullptr, std::vector<float>* owned = nullptr) {
  const size_t count = inputs[0].size();
  const size_t n = inputs.size();
  std::vector<float> out(count), d(block), s(block);
  for (size_t start = 0; start < count; start += block) {
    const size_t len = std::min(block, count - start);
    for (size_t r = 0; r < n; ++r) {
      RoundTrip(inputs[r].data() + start, sent ? (*sent)[r].data() + start : nullptr, len, bits, d.data());
      for (size_t i = 0; i < len; ++i) s[i] = r == 0 ? d[i] : s[i] + d[i];
    }
    if (op == ReduceOp::kAvg) {
      for (size_t i = 0; i < len; ++i) s[i] /= static_cast<float>(n);
    }
    RoundTrip(s.data(), owned ? owned->data() + start : nullptr, len, bits, out.data() + start);
  }
  return out;
}

// Each host's value: the sum (or mean) of its ranks' inputs, in double, then float.
std::vector<std::vector<float>> HostValues(const Layout& layout, size_t count, ReduceOp op, int call) {
  std::vector<std::vector<float>> hosts(layout.hosts, std::vector<float>(count));
  for (int h = 0; h < layout.hosts; ++h) {
    for (size_t i = 0; i < count; ++i) {
      double s = 0.0;
      for (int l = 0; l < layout.per_host; ++l) s += Input(h * layout.per_host + l, i, call);
      hosts[h][i] = static_cast<float>(op == ReduceOp::kAvg ? s / layout.per_host : s);
    }
  }
  return hosts;
}

class HierarchicalQuantizedAllreduceTest : public ::testing::TestWithParam<Layout> {};

TEST_P(HierarchicalQuantizedAllreduceTest, EveryRankGetsTheReferenceOverHostsBits) {
  const Layout layout = GetParam();
  const int n = layout.size();
  if (!InSanitizerRankCounts(std::min(n, 8))) GTEST_SKIP() << "n = " << n << " runs under the other sanitizer";
  struct Case {
    size_t count;
    int bits;
    ReduceOp op;
    size_t block;
  };
  // Counts: empty, fewer elements than ranks, a partial block, slices that end inside the
  // buffer, and (G = 2) more than one slice of the flat algorithm's (kQuantizedSliceElements) per rank.
  std::vector<Case> cases = {{0, 8, ReduceOp::kSum, 256},   {1, 8, ReduceOp::kSum, 256},
                             {300, 4, ReduceOp::kSum, 256}, {5000, 8, ReduceOp::kSum, 100},
                             {5000, 4, ReduceOp::kAvg, 256}, {70001, 8, ReduceOp::kAvg, 256}};
  // G = 2: each rank's slice is just over one of the flat algorithm's slices.
  if (!kSanitizerBuild && layout.per_host == 2) cases.push_back({kQuantizedSliceElements * 2 + 777, 8, ReduceOp::kSum, 256});
  // A host's mean is exact (as the reference's float of a double) where G divides exactly.
  const bool exact_mean = (layout.per_host & (layout.per_host - 1)) == 0;

  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.count, " elements, ", c.bits, " bits, ", ReduceOpName(c.op), ", block ", c.block));
    const std::vector<std::vector<float>> hosts = HostValues(layout, c.count, c.op, 0);
    const std::vector<float> want = Reference(hosts, c.bits, c.block, c.op);
    std::mutex mu;
    std::vector<std::vector<float>> got(n);
    RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
      auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store);
      HostGroups groups = HostGroups::Split(*comm, store, "groups");
      std::vector<float> x(c.count);
      for (size_t i = 0; i < c.count; ++i) x[i] = Input(rank, i);
      QuantizedAllreduceOptions options;
      options.bits = c.bits;
      options.op = c.op;
      options.block_size = c.block;
      HierarchicalQuantizedAllreduce(groups, CpuBuffer(x.data(), c.count), options);
      std::lock_guard<std::mutex> lock(mu);
      got[rank] = std::move(x);
    });
    // The bound over H nodes per element, around the exact result computed in double.
    std::vector<double> exact(c.count, 0.0), bound(c.count);
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < c.count; ++i) exact[i] += Input(q, i);
    }
    for (size_t start = 0; start < c.count; start += c.block) {
      const size_t len = std::min(c.block, c.count - start);
      double maxima = 0.0;
      for (const auto& host : hosts) {
        double m = 0.0;
        for (size_t i = start; i < start + len; ++i) m = std::max(m, std::fabs(static_cast<double>(host[i])));
        maxima += m;
      }
      for (size_t i = start; i < start + len; ++i) {
        bound[i] = QuantizedAllreduceErrorBound(c.bits, layout.hosts, maxima, c.op);
        if (c.op == ReduceOp::kAvg) exact[i] /= n;
      }
    }
    for (int r = 0; r < n; ++r) {
      if (c.op == ReduceOp::kSum || exact_mean) ExpectSameBits(want, got[r], absl::StrCat("rank ", r));
      for (size_t i = 0; i < c.count; ++i) {
        if (std::fabs(got[r][i] - exact[i]) > bound[i]) {
          FAIL() << "rank " << r << ", element " << i << ": " << got[r][i] << ", exact " << exact[i] << ", bound "
                 << bound[i];
        }
      }
      EXPECT_EQ(got[r], got[0]) << "rank " << r << " vs 0";  // NaN-free: equal values, equal bits
    }
  }
}

TEST_P(HierarchicalQuantizedAllreduceTest, ErrorFeedbackFollowsTheReferenceOverHosts) {
  const Layout layout = GetParam();
  const int n = layout.size();
  if (!InSanitizerRankCounts(std::min(n, 8))) GTEST_SKIP() << "n = " << n << " runs under the other sanitizer";
  constexpr size_t kCount = 3000;
  constexpr size_t kBlock = 128;
  constexpr int kCalls = 3;
  // The reference: per host a sent residual, one owned residual (each block has one owner).
  std::vector<std::vector<float>> sent(layout.hosts, std::vector<float>(kCount, 0.0f));
  std::vector<float> owned(kCount, 0.0f);
  std::vector<std::vector<float>> want(kCalls);
  for (int k = 0; k < kCalls; ++k) {
    want[k] = Reference(HostValues(layout, kCount, ReduceOp::kSum, k), 4, kBlock, ReduceOp::kSum, &sent, &owned);
  }
  const size_t slice = ((kCount + layout.per_host - 1) / layout.per_host + kBlock - 1) / kBlock * kBlock;

  std::mutex mu;
  std::vector<std::vector<std::vector<float>>> got(n);
  std::vector<std::vector<float>> got_sent(n), got_owned(n);
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store);
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    QuantizedAllreduceOptions options;
    options.bits = 4;
    options.op = ReduceOp::kSum;
    options.block_size = kBlock;
    std::vector<float> residual_sent(kCount, 0.0f), residual_owned(kCount, 0.0f);
    QuantizedResidual residual;
    residual.sent = CpuBuffer(residual_sent.data(), kCount);
    residual.owned = CpuBuffer(residual_owned.data(), kCount);
    QuantizedAllreduceScratch scratch;
    std::vector<std::vector<float>> outputs;
    for (int k = 0; k < kCalls; ++k) {
      std::vector<float> x(kCount);
      for (size_t i = 0; i < kCount; ++i) x[i] = Input(rank, i, k);
      HierarchicalQuantizedAllreduce(groups, CpuBuffer(x.data(), kCount), options, residual, &scratch);
      outputs.push_back(std::move(x));
    }
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = std::move(outputs);
    got_sent[rank] = std::move(residual_sent);
    got_owned[rank] = std::move(residual_owned);
  });
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < kCalls; ++k) ExpectSameBits(want[k], got[r][k], absl::StrCat("rank ", r, ", call ", k));
    // Element i's residuals live on the local rank whose slice holds it; on the others, zeros.
    const int host = r / layout.per_host;
    const size_t first = std::min(kCount, slice * static_cast<size_t>(r % layout.per_host));
    const size_t last = std::min(kCount, first + slice);
    for (size_t i = 0; i < kCount; ++i) {
      const bool mine = i >= first && i < last;
      const float want_sent = mine ? sent[host][i] : 0.0f;
      if (got_sent[r][i] != want_sent) FAIL() << "rank " << r << ", sent residual " << i << ": " << got_sent[r][i] << ", want " << want_sent;
      // The owned residual: the reference's on the host that owns the element's block among
      // the slice's H holders (QuantizedOwnedRanges over the slice), zero on every other rank.
      bool owner = false;
      if (mine) {
        for (const auto& [b, e] : QuantizedOwnedRanges(last - first, kBlock, host, layout.hosts)) {
          owner = owner || (i >= first + b && i < first + e);
        }
      }
      const float want_owned = owner ? owned[i] : 0.0f;
      if (got_owned[r][i] != want_owned) FAIL() << "rank " << r << ", owned residual " << i << ": " << got_owned[r][i] << ", want " << want_owned;
    }
  }
}

TEST_P(HierarchicalQuantizedAllreduceTest, EachHostSendsOneCopyAcross) {
  const Layout layout = GetParam();
  const int n = layout.size();
  if (layout.hosts < 2) GTEST_SKIP() << "one host: nothing crosses a NIC";
  if (!InSanitizerRankCounts(std::min(n, 8))) GTEST_SKIP() << "n = " << n << " runs under the other sanitizer";
  constexpr size_t kCount = 1 << 20;
  // The flat form over H ranks (one per host): what one host's NIC carries at H x 1.
  std::vector<size_t> flat_bytes(layout.hosts);
  RunRanks(layout.hosts, LaunchMode::kThreads, [&](Communicator& comm) {
    std::vector<float> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = Input(comm.rank(), i);
    const uint64_t before = comm.traffic().p2p_bytes_sent;
    QuantizedAllreduce(comm, CpuBuffer(x.data(), kCount), {});
    flat_bytes[comm.rank()] = comm.traffic().p2p_bytes_sent - before;
  });
  std::mutex mu;
  std::vector<size_t> host_bytes(layout.hosts, 0);
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store);
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    std::vector<float> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = Input(rank, i);
    // What went over the groups across hosts, counted by the communicators, not by the call.
    const uint64_t before = groups.across->traffic().p2p_bytes_sent;
    HierarchicalQuantizedAllreduce(groups, CpuBuffer(x.data(), kCount), {});
    const size_t sent = groups.across->traffic().p2p_bytes_sent - before;
    std::lock_guard<std::mutex> lock(mu);
    host_bytes[rank / layout.per_host] += sent;
  });
  for (int h = 0; h < layout.hosts; ++h) {
    EXPECT_LE(host_bytes[h], flat_bytes[h] * 1.1) << "host " << h << " sent " << host_bytes[h] << " bytes across, "
                                                  << "one rank of the flat form over " << layout.hosts << " "
                                                  << flat_bytes[h];
    EXPECT_GE(host_bytes[h], flat_bytes[h] * 0.9) << "host " << h;
  }
}

TEST_P(HierarchicalQuantizedAllreduceTest, BadInputFailsTheSameOnEveryRank) {
  const Layout layout = GetParam();
  const int n = layout.size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  if (!InSanitizerRankCounts(std::min(n, 8))) GTEST_SKIP() << "n = " << n << " runs under the other sanitizer";
  constexpr size_t kCount = 1000;
  const int odd = n - 1;  // the last rank: on the last host
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode == 0 ? "bits 3 on one rank" : mode == 1 ? "another count on one rank" : "a NaN on one rank");
    std::mutex mu;
    std::vector<std::string> errors(n);
    std::vector<std::vector<float>> got(n);
    RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
      auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store);
      HostGroups groups = HostGroups::Split(*comm, store, "groups");
      const size_t count = mode == 1 && rank == odd ? kCount + 1 : kCount;
      std::vector<float> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = Input(rank, i);
      if (mode == 2 && rank == odd) x[700] = std::numeric_limits<float>::quiet_NaN();
      QuantizedAllreduceOptions options;
      if (mode == 0 && rank == odd) options.bits = 3;
      std::string error;
      try {
        HierarchicalQuantizedAllreduce(groups, CpuBuffer(x.data(), count), options);
      } catch (const InvalidArgumentError& e) {
        error = std::string("invalid: ") + e.what();
      } catch (const MismatchError& e) {
        error = std::string("mismatch: ") + e.what();
      }
      std::lock_guard<std::mutex> lock(mu);
      errors[rank] = error;
      got[rank] = std::move(x);
    });
    for (int r = 0; r < n; ++r) {
      if (mode == 2) {
        EXPECT_EQ(errors[r], "") << "rank " << r;
        // Block 2 (elements 512..767) holds the NaN: NaN everywhere in it, finite elsewhere.
        for (size_t i = 0; i < kCount; ++i) {
          const bool in_block = i >= 512 && i < 768;
          if (std::isnan(got[r][i]) != in_block) FAIL() << "rank " << r << ", element " << i << ": " << got[r][i];
        }
        continue;
      }
      EXPECT_THAT(errors[r], HasSubstr(mode == 0 ? "invalid: " : "mismatch: ")) << "rank " << r;
      EXPECT_THAT(errors[r], HasSubstr(mode == 0 ? absl::StrCat("rank ", odd, ": bits must be 4 or 8, got 3")
                                                 : absl::StrCat("rank ", odd, ": ", kCount + 1)))
          << "rank " << r;
      EXPECT_THAT(errors[r], HasSubstr(absl::StrCat("on rank ", r, " of ", n))) << "rank " << r;
      for (size_t i = 0; i < kCount; ++i) {
        if (got[r][i] != Input(r, i)) FAIL() << "rank " << r << ": element " << i << " was modified";
      }
    }
  }
}

// Hosts whose ranks interleave (rank r on host r % 2: hosts {0, 2} and {1, 3}): the result is
// the quantized all-reduce over those hosts' sums, and the check names ranks by their place in
// the parent communicator (its two-level gather puts the headers back in rank order).
TEST(HierarchicalQuantizedAllreduceInterleavedTest, HostsOfInterleavedRanks) {
  constexpr int kN = 4;
  constexpr size_t kCount = 3000;
  std::vector<std::vector<float>> hosts(2, std::vector<float>(kCount, 0.0f));
  for (int r = 0; r < kN; ++r) {
    for (size_t i = 0; i < kCount; ++i) hosts[r % 2][i] += Input(r, i);
  }
  const std::vector<float> want = Reference(hosts, 8, 256, ReduceOp::kSum);
  for (bool bad : {false, true}) {
    std::mutex mu;
    std::vector<std::vector<float>> got(kN);
    std::vector<std::string> errors(kN);
    RunRanksWithStore(kN, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
      CommunicatorOptions o;
      o.host_key = absl::StrCat("host", rank % 2);
      o.timeout = std::chrono::seconds(60);
      auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, kN, o);
      EXPECT_TRUE(comm->hierarchical());
      HostGroups groups = HostGroups::Split(*comm, store, "groups");
      std::vector<float> x(kCount);
      for (size_t i = 0; i < kCount; ++i) x[i] = Input(rank, i);
      QuantizedAllreduceOptions options;
      options.op = ReduceOp::kSum;
      if (bad && rank == 2) options.bits = 3;
      try {
        HierarchicalQuantizedAllreduce(groups, CpuBuffer(x.data(), kCount), options);
      } catch (const InvalidArgumentError& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors[rank] = e.what();
      }
      std::lock_guard<std::mutex> lock(mu);
      got[rank] = std::move(x);
    });
    for (int r = 0; r < kN; ++r) {
      if (!bad) {
        ExpectSameBits(want, got[r], absl::StrCat("rank ", r));
        continue;
      }
      EXPECT_THAT(errors[r], HasSubstr("rank 2: bits must be 4 or 8, got 3")) << "rank " << r;
      EXPECT_THAT(errors[r], HasSubstr(absl::StrCat("on rank ", r, " of 4"))) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalQuantizedAllreduceTest,
                         ::testing::Values(Layout{1, 4}, Layout{2, 2}, Layout{4, 2}, Layout{3, 3}, Layout{3, 2},
                                           Layout{2, 3}, Layout{3, 1}, Layout{1, 1}),
                         HostLayoutName);

}  // namespace
}  // namespace testing
}  // namespace gossipcc
