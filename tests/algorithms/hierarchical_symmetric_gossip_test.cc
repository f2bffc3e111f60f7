// HierarchicalSymmetricGossip (algorithms/hierarchical_symmetric_gossip.h) on H x G layouts,
// against D-PSGD over the hosts computed here from its definition (each host's value the mean
// of its ranks; Metropolis-Hastings weights 1 / (1 + max(d_i, d_j)) over the graph's neighbours);
// the average over all ranks kept; one slice, 1/G of the buffer, per rank, neighbour and round
// across hosts; errors that leave x and the step alone.
#include "algorithms/hierarchical_symmetric_gossip.h"

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

float Input(int rank, size_t i) { return static_cast<float>(std::cos(0.29 * i + 0.7 * rank) * (rank + 2) - 0.003 * i); }

// `rounds` D-PSGD rounds over H nodes from step 0, by the definition.
void SymmetricGossipOverHosts(const PeerGraph& graph, int rounds, std::vector<std::vector<double>>& x) {
  const int h = graph.world_size();
  for (int k = 0; k < rounds; ++k) {
    std::vector<int> degree(h);
    for (int j = 0; j < h; ++j) degree[j] = static_cast<int>(graph.OutPeers(j, k).size());
    std::vector<std::vector<double>> nx = x;
    for (int j = 0; j < h; ++j) {
      for (int t : graph.OutPeers(j, k)) {
        const double w = 1.0 / (1.0 + std::max(degree[j], degree[t]));
        for (size_t i = 0; i < x[j].size(); ++i) nx[j][i] += w * (x[t][i] - x[j][i]);
      }
    }
    x = std::move(nx);
  }
}

class HierarchicalSymmetricGossipTest : public ::testing::TestWithParam<Layout> {};

TEST_P(HierarchicalSymmetricGossipTest, HostsFollowSymmetricGossipOverHosts) {
  const Layout layout = GetParam();
  const int n = layout.size();
  if (!InSanitizerRankCounts(std::min(n, 8))) GTEST_SKIP() << "n = " << n << " runs under the other sanitizer (harness.h)";
  constexpr size_t kCount = 1001;  // not a multiple of G = 2, 3: the last slice is padded
  constexpr int kRounds = 4;
  auto graph = std::shared_ptr<const PeerGraph>(MakeRingGraph(layout.hosts));

  double total = 0.0;
  std::vector<std::vector<double>> want = testing::HostMeans(layout, kCount, Input, &total);
  SymmetricGossipOverHosts(*graph, kRounds, want);

  std::mutex mu;
  std::vector<std::vector<float>> got(n);
  std::vector<uint64_t> sent_across(n);
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store);
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    std::vector<float> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = Input(rank, i);
    HierarchicalSymmetricGossip gossip(graph);
    const std::vector<Buffer> buffers = {CpuBuffer(x.data(), 400), CpuBuffer(x.data() + 400, kCount - 400)};
    for (int k = 0; k < kRounds; ++k) gossip.Step(groups, buffers);
    EXPECT_EQ(gossip.step(), kRounds);
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = x;
    sent_across[rank] = groups.across->traffic().p2p_bytes_sent;
  });

  // Across hosts: this rank's slice (and a 16-byte round header) to each ring neighbour per round;
  // W doubly stochastic: the sum over all ranks kept.
  testing::CheckHostRound(layout, got, want, total, sent_across,
                          [&](int h) { return uint64_t{kRounds} * graph->OutPeers(h, 0).size(); }, 16);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalSymmetricGossipTest,
                         ::testing::Values(Layout{2, 2}, Layout{4, 2}, Layout{3, 3}, Layout{1, 4}, Layout{2, 3},
                                           Layout{3, 1}, Layout{1, 1}),
                         HostLayoutName);

// Hosts that disagree on the count: the gossip across hosts fails with MismatchError on every
// rank (within the timeout), and x and the step are as before the call.
TEST(HierarchicalSymmetricGossipErrorsTest, MismatchedCountsFailAndLeaveTheStateAlone) {
  const Layout layout{2, 2};
  auto graph = std::shared_ptr<const PeerGraph>(MakeRingGraph(layout.hosts));
  RunRanksWithStore(layout.size(), LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store, std::chrono::seconds(10));
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    HierarchicalSymmetricGossip gossip(graph);
    std::vector<float> x(rank < 2 ? 100 : 102, static_cast<float>(rank));
    const std::vector<float> before = x;
    const std::string message =
        testing::ExpectThrow<MismatchError>([&] { gossip.Step(groups, {CpuBuffer(x.data(), x.size())}); });
    EXPECT_NE(message.find("symmetric"), std::string::npos) << message;
    EXPECT_EQ(x, before) << "rank " << rank;
    EXPECT_EQ(gossip.step(), 0);
  });
}

// Counts that differ by less than G, so that padding gives every host the same slice size:
// across hosts (host 1 has one element more) the last local rank's slices differ and its round
// fails, and every other rank fails the host's agreement; inside a host (one rank has one
// element more) the host's check names both counts, and the other host's ranks, whose partners
// never come, fail within the timeout. x and the step are unchanged everywhere.
TEST(HierarchicalSymmetricGossipErrorsTest, CountsThatDifferByLessThanTheHostSizeFail) {
  const Layout layout{2, 2};
  auto graph = std::shared_ptr<const PeerGraph>(MakeRingGraph(layout.hosts));
  for (bool inside : {false, true}) {
    SCOPED_TRACE(inside ? "inside a host" : "across hosts");
    std::mutex mu;
    std::vector<std::string> errors(layout.size());
    RunRanksWithStore(layout.size(), LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
      auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store, std::chrono::seconds(5));
      HostGroups groups = HostGroups::Split(*comm, store, "groups");
      testing::MeetThroughStore(*store, rank, layout.size(), "split");
      HierarchicalSymmetricGossip gossip(graph);
      const bool more = inside ? rank == 1 : rank >= 2;
      std::vector<float> x(more ? 102 : 101, static_cast<float>(rank));
      const std::vector<float> before = x;
      const std::string message =
          testing::ExpectThrow<CommError>([&] { gossip.Step(groups, {CpuBuffer(x.data(), x.size())}); });
      EXPECT_EQ(x, before) << "rank " << rank;
      EXPECT_EQ(gossip.step(), 0) << "rank " << rank;
      std::lock_guard<std::mutex> lock(mu);
      errors[rank] = message;
    });
    if (inside) {
      for (int r : {0, 1}) {
        EXPECT_NE(errors[r].find("local rank 0: 101 x float32 at step 0; local rank 1: 102 x float32 at step 0"),
                  std::string::npos)
            << errors[r];
      }
    } else {
      // Local rank 1 of each host ran the round whose sizes differ (50 vs 51 elements).
      for (int r : {1, 3}) EXPECT_NE(errors[r].find("symmetric"), std::string::npos) << errors[r];
      for (int r : {0, 2}) EXPECT_NE(errors[r].find("local rank 1 of this host failed"), std::string::npos) << errors[r];
    }
    for (int r = 0; r < layout.size(); ++r) EXPECT_FALSE(errors[r].empty()) << "rank " << r;
  }
}

}  // namespace
}  // namespace gossipcc
