// The two-level all-reduce (comm/gloo/hierarchical_allreduce.h) over hosts given by
// CommunicatorOptions::host_key: H x G layouts with ranks placed on hosts in rank order and
// interleaved, every reduce op and dtype it runs, sizes from 0 past the ring's threshold,
// against a reference computed here and bit-identical across ranks; the topology learned; bad
// settings and failures.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/core/reduce.h"
#include "comm/core/topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"
#include "tests/comm/typed_array.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct Layout {
  int hosts;
  int per_host;
  bool interleaved;  // rank r on host r % hosts; else on host r / per_host
  int size() const { return hosts * per_host; }
  int host_of(int rank) const { return interleaved ? rank % hosts : rank / per_host; }
};

std::string LayoutName(const ::testing::TestParamInfo<Layout>& info) {
  return absl::StrCat(info.param.hosts, "x", info.param.per_host, info.param.interleaved ? "_interleaved" : "");
}

CommunicatorOptions OnHost(std::string host, TopologyMode mode = TopologyMode::kHierarchical) {
  CommunicatorOptions o;
  o.topology = mode;
  o.host_key = std::move(host);
  o.rendezvous_timeout = std::chrono::seconds(60);
  return o;
}

// Rank r's input: small integers, so that every sum, product and average is exact in every
// dtype and the reference does not depend on the order of the additions.
double Input(int rank, size_t i, ReduceOp op) {
  if (op == ReduceOp::kProduct) return 1.0 + static_cast<double>((rank + i) % 2);  // 1 or 2
  return static_cast<double>(static_cast<int>((rank * 131 + i * 7) % 23) - 11);
}

// The reduction over ranks of Input, as this library defines it (kAvg: the sum scaled by 1/n
// with ScaleInPlace, as every all-reduce of this library does).
TypedArray Reference(DType dtype, size_t count, ReduceOp op, int n) {
  TypedArray want(dtype, count);
  TypedArray stored(dtype, 1);  // an input as the dtype holds it (uint8 wraps negatives)
  auto input = [&](int r, size_t i) {
    stored.set(0, Input(r, i, op));
    return stored.get(0);
  };
  for (size_t i = 0; i < count; ++i) {
    double acc = input(0, i);
    for (int r = 1; r < n; ++r) {
      const double x = input(r, i);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: acc += x; break;
        case ReduceOp::kProduct: acc *= x; break;
        case ReduceOp::kMax: acc = std::max(acc, x); break;
        case ReduceOp::kMin: acc = std::min(acc, x); break;
        default: break;
      }
    }
    want.set(i, acc);
  }
  if (op == ReduceOp::kAvg) ScaleInPlace(want.buffer().data, count, dtype, 1.0 / n);
  return want;
}

// The bytes of every rank's result, compared through the store: the same bits everywhere.
void ExpectSameOnEveryRank(Store& store, int rank, int n, const std::string& key, const std::vector<uint8_t>& bytes) {
  store.set(absl::StrCat(key, "/", rank), std::vector<char>(bytes.begin(), bytes.end()));
  for (int r = 0; r < n; ++r) {
    const std::vector<char> theirs = store.get(absl::StrCat(key, "/", r), std::chrono::seconds(120));
    ASSERT_TRUE(theirs.size() == bytes.size() && std::memcmp(theirs.data(), bytes.data(), bytes.size()) == 0)
        << key << ": rank " << rank << "'s result differs from rank " << r << "'s";
  }
}

class HierarchicalAllreduceTest : public ::testing::TestWithParam<Layout> {};

struct Case {
  DType dtype;
  ReduceOp op;
  size_t count;
};

// 0, a few elements (eager), past the direct all-reduce's 512 KiB (the two-level ring), and
// counts that leave chunks uneven or empty. Under a sanitizer each n runs a third of them,
// (index + n) % 3 == 0, as communicator_test thins its ring sweep: the two-level plan depends on
// the layout, the reduction kernel on (dtype, op).
std::vector<Case> CasesFor(int n) {
  std::vector<Case> cases;
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProduct}) {
      const bool integer = dtype == DType::kInt32 || dtype == DType::kInt64;
      if (op == ReduceOp::kAvg && integer) continue;  // refused for integers (errors_test)
      cases.push_back({dtype, op, 150001});
    }
  }
  for (size_t count : {size_t{0}, size_t{5}, size_t{1} << 20, (size_t{1} << 20) + 13}) {
    cases.push_back({DType::kFloat32, ReduceOp::kSum, count});
  }
  cases.push_back({DType::kInt8, ReduceOp::kMax, 600001});
  cases.push_back({DType::kUInt8, ReduceOp::kMin, 600001});
  if (!kSanitizerBuild || FullSuite()) return cases;
  std::vector<Case> third;
  for (size_t i = 0; i < cases.size(); ++i) {
    if ((i + n) % 3 == 0) third.push_back(cases[i]);
  }
  return third;
}

TEST_P(HierarchicalAllreduceTest, EqualsTheReferenceOnEveryRank) {
  const Layout layout = GetParam();
  const int n = layout.size();
  if (!InSanitizerRankCounts(n)) GTEST_SKIP() << "n = " << n << " runs under the other sanitizer (harness.h)";
  // The references, once for all ranks (each is n inputs per element).
  const std::vector<Case> cases = CasesFor(n);
  std::vector<TypedArray> wants;
  for (const Case& c : cases) wants.push_back(Reference(c.dtype, c.count, c.op, n));
  constexpr size_t kRandomCount = size_t{1} << 19;
  std::vector<double> random_sum(kRandomCount, 0.0);
  for (int r = 0; r < n; ++r) {
    std::mt19937 g(1234 + r);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (double& w : random_sum) w += u(g);
  }
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, n,
                                     OnHost(absl::StrCat("host", layout.host_of(rank))));
    // The topology learned: hosts in the order of their lowest rank, ranks in rank order.
    const Topology& t = comm->topology();
    ASSERT_EQ(t.hosts(), layout.hosts);
    EXPECT_EQ(comm->hierarchical(), n > 1);
    for (int r = 0; r < n; ++r) EXPECT_EQ(t.host_of(r), layout.host_of(r)) << "rank " << r;
    EXPECT_EQ(t.ranks_on_host(t.host_of(rank)).size(), static_cast<size_t>(layout.per_host));

    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      const TypedArray& want = wants[k];
      const std::string what = absl::StrCat(DTypeName(c.dtype), " ", ReduceOpName(c.op), " x", c.count);
      TypedArray data(c.dtype, c.count);
      for (size_t i = 0; i < c.count; ++i) data.set(i, Input(rank, i, c.op));
      comm->allreduce(data.buffer(), c.op)->wait();
      for (size_t i = 0; i < c.count; ++i) {
        if (data.get(i) != want.get(i)) {
          FAIL() << what << " on rank " << rank << ": element " << i << " is " << data.get(i) << ", want "
                 << want.get(i);
        }
      }
      ASSERT_NO_FATAL_FAILURE(ExpectSameOnEveryRank(*store, rank, n, what, data.raw()));
    }

    // Real-valued data: the sum over hosts of sums over each host's ranks, to rounding, and
    // the same bits on every rank.
    std::mt19937 gen(1234 + rank);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(kRandomCount);
    for (float& v : x) v = u(gen);
    comm->allreduce(CpuBuffer(x.data(), x.size()))->wait();
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::abs(x[i] - random_sum[i]) > 1e-5 * n) {
        FAIL() << "random sum, element " << i << ": " << x[i] << " vs " << random_sum[i];
      }
    }
    std::vector<uint8_t> bits(x.size() * sizeof(float));
    std::memcpy(bits.data(), x.data(), bits.size());
    ASSERT_NO_FATAL_FAILURE(ExpectSameOnEveryRank(*store, rank, n, "random", bits));
  }, std::chrono::seconds(400));
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalAllreduceTest,
                         ::testing::Values(Layout{1, 4, false}, Layout{2, 2, false}, Layout{4, 2, false},
                                           Layout{3, 3, false}, Layout{2, 3, true}, Layout{4, 1, false},
                                           Layout{1, 1, false}),
                         LayoutName);

// Hosts of 2 and 1 ranks: kHierarchical fails Create on every rank naming the hosts and their
// ranks; kAuto runs flat (and right).
TEST(HierarchicalTopologyTest, UnevenHostsAreRefusedOrFlat) {
  const char* hosts[] = {"a", "a", "b"};
  ExpectCreateFailsOnEveryRank(
      3, [&](int rank) { return OnHost(hosts[rank]); }, "topology",
      [](int) { return std::string("2 hosts: a (ranks 0, 1), b (rank 2)"); });
  RunRanksWithStore(3, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 3,
                                     OnHost(hosts[rank], TopologyMode::kAuto));
    EXPECT_FALSE(comm->hierarchical());
    EXPECT_EQ(comm->topology().Describe(), "2 hosts: a (ranks 0, 1), b (rank 2)");
    std::vector<float> x(size_t{1} << 18, static_cast<float>(rank + 1));
    comm->allreduce(CpuBuffer(x.data(), x.size()))->wait();
    EXPECT_EQ(x.front(), 6.0f);
    EXPECT_EQ(x.back(), 6.0f);
  });
}

// kAuto, the default, is hierarchical on several hosts of as many ranks, some holding more than
// one; flat on hosts of one rank each and on one host (no NIC to spare).
TEST(HierarchicalTopologyTest, TheDefaultFollowsTheHosts) {
  struct Hosts {
    std::string name;
    int (*host_of)(int rank);
    bool hierarchical;
  };
  const Hosts layouts[] = {{"2 hosts of 2", [](int r) { return r / 2; }, true},
                           {"4 hosts of 1", [](int r) { return r; }, false},
                           {"1 host of 4", [](int) { return 0; }, false}};
  for (const Hosts& hosts : layouts) {
    RunRanksWithStore(4, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
      CommunicatorOptions o;  // topology left at its default
      o.host_key = absl::StrCat("h", hosts.host_of(rank));
      o.rendezvous_timeout = std::chrono::seconds(60);
      auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 4, o);
      EXPECT_EQ(comm->hierarchical(), hosts.hierarchical) << hosts.name;
    });
  }
}

// Without host_key, ranks on this machine (one network namespace) share one host.
TEST(HierarchicalTopologyTest, RanksOfOneMachineShareAHostByDefault) {
  RunRanksWithStore(3, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 3, CommunicatorOptions{});
    EXPECT_EQ(comm->topology().hosts(), 1);
    EXPECT_FALSE(comm->hierarchical());
  });
}

TEST(HierarchicalTopologyTest, RanksThatDisagreeOnTheSettingFailAtCreation) {
  ExpectCreateFailsOnEveryRank(
      2,
      [](int rank) { return OnHost(absl::StrCat("h", rank), rank == 0 ? TopologyMode::kHierarchical : TopologyMode::kFlat); },
      "topology", [](int rank) {
        return std::string(rank == 0 ? "is hierarchical here but flat on rank(s) 1;"
                                     : "is flat here but hierarchical on rank(s) 0;");
      });
}

// A signature disagreement is found before any message: the same MismatchError on every rank,
// the data untouched; the communicator goes on.
TEST(HierarchicalErrorsTest, MismatchedCountsAreNamedAndLeaveTheDataAlone) {
  RunRanksWithStore(4, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 4,
                                     OnHost(absl::StrCat("h", rank / 2)));
    std::vector<float> x(rank == 3 ? 300000 : 300001, 2.0f);
    auto w = comm->allreduce(CpuBuffer(x.data(), x.size()));
    EXPECT_THAT(ExpectThrow<MismatchError>([&] { w->wait(); }), HasSubstr("count"));
    EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](float v) { return v == 2.0f; }));
    std::vector<float> y(300001, 1.0f);
    comm->allreduce(CpuBuffer(y.data(), y.size()))->wait();
    EXPECT_EQ(y[300000], 4.0f);
  });
}

// A rank that shuts down inside a host (2 x 2): every other rank's two-level all-reduce fails
// with a CommError naming the operation, within its timeout.
TEST(HierarchicalErrorsTest, APeerThatLeavesFailsTheAllreduceOnEveryRank) {
  RunRanksWithStore(4, LaunchMode::kProcesses, [&](int rank, std::shared_ptr<Store> store) {
    CommunicatorOptions o = OnHost(absl::StrCat("h", rank / 2));
    o.timeout = std::chrono::seconds(5);
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 4, o);
    comm->barrier()->wait();
    if (rank == 3) {
      comm->shutdown();
      return;
    }
    std::vector<float> x(size_t{1} << 20, 1.0f);
    EXPECT_THAT(ExpectThrow<CommError>([&] { comm->allreduce(CpuBuffer(x.data(), x.size()))->wait(); }),
                HasSubstr("allreduce #1"));
  });
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
