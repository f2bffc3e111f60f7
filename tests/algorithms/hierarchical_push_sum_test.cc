// HierarchicalPushSum (algorithms/hierarchical_push_sum.h) on H x G layouts, against push-sum
// over the hosts computed here from its definition (each host's value the mean of its ranks,
// uniform shares over the graph's out-peers); exact consensus on 2^m hosts after m rounds of
// the one-peer exponential graph (its theory); one slice, 1/G of the buffer, per rank and round
// across hosts; errors that leave x, the weight and the step alone.
#include "algorithms/hierarchical_push_sum.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms/peer_graph.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/core/store.h"
#include "comm/host_groups.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace {

using ::gossipcc::testing::CreateOnHosts;
using ::gossipcc::testing::InSanitizerRankCounts;
using ::gossipcc::testing::LaunchMode;
using ::gossipcc::testing::RunRanksWithStore;

using Layout = ::gossipcc::testing::HostLayout;
using ::gossipcc::testing::HostLayoutName;

// Rank r's input: distinct on every rank and element.
float Input(int rank, size_t i) { return static_cast<float>(std::sin(0.37 * i + 1.3 * rank) * (rank + 1) + 0.01 * i); }

// `rounds` push-sum rounds over H nodes from step 0, by the definition: node j sends
// s_j = 1 / (|out(j, k)| + 1) of its (x, w) to each out-peer and keeps s_j.
void PushSumOverHosts(const PeerGraph& graph, int rounds, std::vector<std::vector<double>>& x, std::vector<double>& w) {
  const int h = graph.world_size();
  for (int k = 0; k < rounds; ++k) {
    std::vector<std::vector<double>> nx(h, std::vector<double>(x[0].size(), 0.0));
    std::vector<double> nw(h, 0.0);
    for (int j = 0; j < h; ++j) {
      std::vector<int> targets = graph.OutPeers(j, k);
      const double share = 1.0 / static_cast<double>(targets.size() + 1);
      targets.push_back(j);
      for (int t : targets) {
        for (size_t i = 0; i < x[j].size(); ++i) nx[t][i] += share * x[j][i];
        nw[t] += share * w[j];
      }
    }
    x = std::move(nx);
    w = std::move(nw);
  }
}

class HierarchicalPushSumTest : public ::testing::TestWithParam<Layout> {};

TEST_P(HierarchicalPushSumTest, HostsFollowPushSumOverHosts) {
  const Layout layout = GetParam();
  const int n = layout.size();
  if (!InSanitizerRankCounts(n)) GTEST_SKIP() << "n = " << n << " runs under the other sanitizer (harness.h)";
  constexpr size_t kCount = 1001;  // not a multiple of G = 2, 3: the last slice is padded
  constexpr int kRounds = 5;
  auto graph = std::shared_ptr<const PeerGraph>(MakeExponentialGraph(layout.hosts, 1));

  // The reference: the hosts' means, then push-sum over the hosts.
  std::vector<std::vector<double>> want(layout.hosts, std::vector<double>(kCount, 0.0));
  std::vector<double> want_w(layout.hosts, 1.0);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < kCount; ++i) want[r / layout.per_host][i] += Input(r, i) / layout.per_host;
  }
  PushSumOverHosts(*graph, kRounds, want, want_w);

  std::mutex mu;
  std::vector<std::vector<float>> got(n);
  std::vector<double> got_w(n);
  std::vector<uint64_t> sent_across(n);
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store);
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    EXPECT_EQ(groups.host->size(), layout.per_host);
    EXPECT_EQ(groups.across->size(), layout.hosts);
    EXPECT_EQ(groups.host_index, rank / layout.per_host);
    EXPECT_EQ(groups.local_rank, rank % layout.per_host);
    std::vector<float> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = Input(rank, i);
    HierarchicalPushSum push_sum(graph);
    // Two buffers, as one numerator (a slice boundary falls inside the first at G = 2, 3).
    const std::vector<Buffer> buffers = {CpuBuffer(x.data(), 600), CpuBuffer(x.data() + 600, kCount - 600)};
    for (int k = 0; k < kRounds; ++k) push_sum.Step(groups, buffers);
    EXPECT_EQ(push_sum.step(), kRounds);
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = x;
    got_w[rank] = push_sum.weight();
    sent_across[rank] = groups.across->traffic().p2p_bytes_sent;
  });

  const size_t slice = (kCount + layout.per_host - 1) / layout.per_host;
  for (int r = 0; r < n; ++r) {
    const int h = r / layout.per_host;
    EXPECT_NEAR(got_w[r], want_w[h], 1e-12) << "rank " << r;
    for (size_t i = 0; i < kCount; ++i) {
      if (std::abs(got[r][i] - want[h][i]) > 1e-4) {
        FAIL() << "rank " << r << " (host " << h << "), element " << i << ": " << got[r][i] << ", want " << want[h][i];
      }
    }
    // The host's ranks hold the same bits.
    const int first = h * layout.per_host;
    EXPECT_EQ(std::memcmp(got[r].data(), got[first].data(), kCount * sizeof(float)), 0)
        << "rank " << r << " differs from rank " << first << " of its host";
    // Across hosts: one message of this rank's slice (plus a 24-byte header and weight) per
    // out-peer and round; the one-peer graph has one out-peer where there are other hosts.
    // The slice's elements of x, not its padding: the last local rank's slice is shorter.
    const size_t slice_first = std::min(kCount, slice * static_cast<size_t>(r % layout.per_host));
    const size_t length = std::min(kCount, slice_first + slice) - slice_first;
    const uint64_t per_round = layout.hosts > 1 ? length * sizeof(float) + 24 : 0;
    EXPECT_EQ(sent_across[r], kRounds * per_round) << "rank " << r << ": bytes sent across hosts";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalPushSumTest,
                         ::testing::Values(Layout{2, 2}, Layout{4, 2}, Layout{3, 2}, Layout{2, 3}, Layout{1, 3},
                                           Layout{3, 1}, Layout{1, 1}),
                         HostLayoutName);

// The one-peer exponential graph on 2^m nodes averages exactly in m rounds from step 0
// (uniform halves: after round k each node holds the mean of 2^(k+1) consecutive nodes): on 4
// hosts of 2 ranks, two rounds leave the mean over all 8 ranks on every rank.
TEST(HierarchicalPushSumConsensusTest, PowerOfTwoHostsAgreeOnTheMeanOfAllRanks) {
  const Layout layout{4, 2};
  const int n = layout.size();
  constexpr size_t kCount = 257;
  std::vector<double> mean(kCount, 0.0);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < kCount; ++i) mean[i] += static_cast<double>(Input(r, i)) / n;
  }
  auto graph = std::shared_ptr<const PeerGraph>(MakeExponentialGraph(layout.hosts, 1));
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store);
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    std::vector<float> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = Input(rank, i);
    HierarchicalPushSum push_sum(graph);
    for (int k = 0; k < 2; ++k) push_sum.Step(groups, {CpuBuffer(x.data(), x.size())});
    push_sum.Debias(CpuBuffer(x.data(), x.size()), CpuBuffer(x.data(), x.size()));
    for (size_t i = 0; i < kCount; ++i) {
      if (std::abs(x[i] - mean[i]) > 1e-5) FAIL() << "rank " << rank << ", element " << i << ": " << x[i] << " vs " << mean[i];
    }
  });
}

// Hosts of 2 and 1 ranks: Split fails on every rank naming the hosts.
TEST(HostGroupsTest, UnevenHostsAreNamed) {
  const char* hosts[] = {"a", "a", "b"};
  RunRanksWithStore(3, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    CommunicatorOptions o;
    o.host_key = hosts[rank];
    o.rendezvous_timeout = std::chrono::seconds(60);
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 3, o);
    const std::string message =
        testing::ExpectThrow<InvalidArgumentError>([&] { HostGroups::Split(*comm, store, "groups"); });
    EXPECT_NE(message.find("as many ranks on every host"), std::string::npos) << message;
    EXPECT_NE(message.find("2 hosts: a (ranks 0, 1), b (rank 2)"), std::string::npos) << message;
  });
}

// Hosts that disagree on the count: the push-sum across hosts fails with MismatchError on
// every rank (within the timeout), and x, the weight and the step are as before the call.
TEST(HierarchicalPushSumErrorsTest, MismatchedCountsFailAndLeaveTheStateAlone) {
  const Layout layout{2, 2};
  const int n = layout.size();
  auto graph = std::shared_ptr<const PeerGraph>(MakeExponentialGraph(layout.hosts, 1));
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store, std::chrono::seconds(10));
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    HierarchicalPushSum push_sum(graph);
    std::vector<float> x(rank < 2 ? 100 : 102, static_cast<float>(rank));
    const std::vector<float> before = x;
    const std::string message = testing::ExpectThrow<CommError>(
        [&] { push_sum.Step(groups, {CpuBuffer(x.data(), x.size())}); });
    EXPECT_NE(message.find("push_sum"), std::string::npos) << message;
    EXPECT_EQ(x, before) << "rank " << rank;
    EXPECT_EQ(push_sum.step(), 0);
    EXPECT_EQ(push_sum.weight(), 1.0);
  });
}

// A rank that dies inside a host (its communicators closed before the round, as at process
// exit): its host's other rank fails in the host's first collective, the rank of the other host
// that gossips with it fails across hosts, and the last rank, whose across-host partner failed
// first, fails too; every rank raises a CommError well within the timeout's safety net, its
// buffers, weight and step unchanged.
TEST(HierarchicalPushSumErrorsTest, ARankThatDiesInsideAHostFailsEveryRank) {
  const Layout layout{2, 2};
  const int dead = 1;  // local rank 1 of host 0
  auto graph = std::shared_ptr<const PeerGraph>(MakeExponentialGraph(layout.hosts, 1));
  std::mutex mu;
  std::vector<std::string> errors(layout.size());
  RunRanksWithStore(layout.size(), LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store, std::chrono::seconds(10));
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    testing::MeetThroughStore(*store, rank, layout.size(), "split");
    if (rank == dead) return;  // its communicators close as the thread leaves
    HierarchicalPushSum push_sum(graph);
    std::vector<float> x(1000, static_cast<float>(rank));
    const std::vector<float> before = x;
    const std::string message =
        testing::ExpectThrow<CommError>([&] { push_sum.Step(groups, {CpuBuffer(x.data(), x.size())}); });
    EXPECT_EQ(x, before) << "rank " << rank;
    EXPECT_EQ(push_sum.step(), 0) << "rank " << rank;
    EXPECT_EQ(push_sum.weight(), 1.0) << "rank " << rank;
    std::lock_guard<std::mutex> lock(mu);
    errors[rank] = message;
  });
  for (int r = 0; r < layout.size(); ++r) {
    if (r != dead) {
      EXPECT_FALSE(errors[r].empty()) << "rank " << r;
    }
  }
  // The rank on the dead rank's host fails in the host's first collective, the peer check
  // naming the shutdown.
  EXPECT_NE(errors[0].find("has shut down its communicator"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace gossipcc
