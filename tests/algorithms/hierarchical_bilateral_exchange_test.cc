// HierarchicalBilateralExchange (algorithms/hierarchical_bilateral_exchange.h) on H x G layouts,
// against the bilateral exchange over the hosts computed here from its definition (each host's
// value the mean of its ranks; paired hosts average, idle hosts keep theirs) on the hypercube
// matching (partner h XOR 2^(k mod log2 H), written out here) where H is a power of two, and on
// the round-robin matching (idles included) otherwise; the average over all ranks kept; one slice,
// 1/G of the buffer, per rank and exchange across hosts; errors that leave x and the step alone.
#include "algorithms/hierarchical_bilateral_exchange.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/bilateral_exchange.h"
#include "algorithms/peer_graph.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/core/store.h"
#include "comm/host_groups.h"
#include "gtest/gtest.h"
#include "tests/algorithms/host_round_checks.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace {

using ::gossipcc::testing::CreateOnHosts;
using ::gossipcc::testing::InSanitizerRankCounts;
using ::gossipcc::testing::LaunchMode;
using ::gossipcc::testing::RunRanksWithStore;

using Layout = ::gossipcc::testing::HostLayout;
using ::gossipcc::testing::HostLayoutName;

float Input(int rank, size_t i) { return static_cast<float>(std::sin(0.31 * i + 0.9 * rank) * (rank + 3) + 0.002 * i); }

bool PowerOfTwo(int h) { return h >= 2 && (h & (h - 1)) == 0; }

// The hypercube's partner of host `h` at step `k` among `hosts` (a power of two).
int HypercubePartner(int h, int64_t k, int hosts) {
  int tau = 0;
  while ((1 << tau) < hosts) ++tau;
  return h ^ (1 << (k % tau));
}

// The partner of host `h` at step `k` in the matching the test runs on this layout.
int PartnerOf(int h, int64_t k, int hosts) {
  return PowerOfTwo(hosts) ? HypercubePartner(h, k, hosts) : BilateralExchange::RoundRobinPartner(h, k, hosts);
}

class HierarchicalBilateralExchangeTest : public ::testing::TestWithParam<Layout> {};

TEST_P(HierarchicalBilateralExchangeTest, HostsFollowTheBilateralExchangeOverHosts) {
  const Layout layout = GetParam();
  const int n = layout.size();
  if (!InSanitizerRankCounts(std::min(n, 8))) GTEST_SKIP() << "n = " << n << " runs under the other sanitizer (harness.h)";
  constexpr size_t kCount = 1001;  // not a multiple of G = 2, 3: the last slice is padded
  constexpr int kRounds = 4;

  // The reference: host means, then kRounds pairwise averages over the hosts.
  double total = 0.0;
  std::vector<std::vector<double>> want = testing::HostMeans(layout, kCount, Input, &total);
  std::vector<int> exchanges(layout.hosts, 0);
  for (int k = 0; k < kRounds; ++k) {
    std::vector<std::vector<double>> next = want;
    for (int h = 0; h < layout.hosts; ++h) {
      const int p = PartnerOf(h, k, layout.hosts);
      if (p < 0) continue;
      ++exchanges[h];
      for (size_t i = 0; i < kCount; ++i) next[h][i] = (want[h][i] + want[p][i]) / 2;
    }
    want = std::move(next);
  }

  std::mutex mu;
  std::vector<std::vector<float>> got(n);
  std::vector<uint64_t> sent_across(n);
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store);
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    std::vector<float> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = Input(rank, i);
    HierarchicalBilateralExchange exchange =
        PowerOfTwo(layout.hosts)
            ? HierarchicalBilateralExchange(std::shared_ptr<const PeerGraph>(MakePeerGraph("hypercube", layout.hosts)))
            : HierarchicalBilateralExchange(BilateralExchange::Matching::kRoundRobin);
    const std::vector<Buffer> buffers = {CpuBuffer(x.data(), 400), CpuBuffer(x.data() + 400, kCount - 400)};
    for (int k = 0; k < kRounds; ++k) exchange.Step(groups, buffers);
    EXPECT_EQ(exchange.step(), kRounds);
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = x;
    sent_across[rank] = groups.across->traffic().p2p_bytes_sent;
  });

  // Across hosts: this rank's slice (and a 16-byte header) to its host's partner per exchange;
  // pairwise averages keep the sum over all ranks.
  testing::CheckHostRound(layout, got, want, total, sent_across, [&](int h) { return uint64_t(exchanges[h]); }, 16);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalBilateralExchangeTest,
                         ::testing::Values(Layout{2, 2}, Layout{4, 2}, Layout{3, 2}, Layout{1, 4}, Layout{2, 3},
                                           Layout{3, 1}, Layout{1, 1}),
                         HostLayoutName);

// Hosts that disagree on the count: the exchange across hosts fails on every rank (within the
// timeout), and x and the step are as before the call.
TEST(HierarchicalBilateralExchangeErrorsTest, MismatchedCountsFailAndLeaveTheStateAlone) {
  const Layout layout{2, 2};
  RunRanksWithStore(layout.size(), LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store, std::chrono::seconds(10));
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    HierarchicalBilateralExchange exchange;
    std::vector<float> x(rank < 2 ? 100 : 102, static_cast<float>(rank));
    const std::vector<float> before = x;
    const std::string message =
        testing::ExpectThrow<CommError>([&] { exchange.Step(groups, {CpuBuffer(x.data(), x.size())}); });
    EXPECT_NE(message.find("bilateral_exchange"), std::string::npos) << message;
    EXPECT_EQ(x, before) << "rank " << rank;
    EXPECT_EQ(exchange.step(), 0) << "rank " << rank;
  });
}

// A graph that is not for H nodes: InvalidArgumentError on every rank, nothing changed.
TEST(HierarchicalBilateralExchangeErrorsTest, AGraphOverRanksInsteadOfHostsIsNamed) {
  const Layout layout{2, 2};
  RunRanksWithStore(layout.size(), LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store, std::chrono::seconds(10));
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    HierarchicalBilateralExchange exchange(std::shared_ptr<const PeerGraph>(MakePeerGraph("hypercube", 4)));
    std::vector<float> x(64, static_cast<float>(rank));
    const std::vector<float> before = x;
    const std::string message =
        testing::ExpectThrow<CommError>([&] { exchange.Step(groups, {CpuBuffer(x.data(), x.size())}); });
    EXPECT_NE(message.find("is for 4 ranks but the communicator has 2"), std::string::npos) << message;
    EXPECT_EQ(x, before) << "rank " << rank;
    EXPECT_EQ(exchange.step(), 0) << "rank " << rank;
  });
}

}  // namespace
}  // namespace gossipcc
