// Elastic averaging (EASGD) and all-reduce SGD with uneven steps on hosts of several ranks:
// both are built on Communicator::allreduce, which on a two-level topology (2 hosts x 2 ranks
// here, CommunicatorOptions::topology's default) runs large buffers in two levels
// (comm/gloo/hierarchical_allreduce.h): one copy per host NIC. Checked against each algorithm's
// definition computed here: EASGD's x_i <- x_i - alpha (x_i - c), c <- c + sum_i alpha (x_i - c)
// over three averagings, and the uneven average over the ranks that contributed.
#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "algorithms/elastic_averaging.h"
#include "algorithms/uneven_allreduce_sgd.h"
#include "comm/communicator.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace {

using ::gossipcc::testing::CreateOnHosts;
using ::gossipcc::testing::LaunchMode;
using ::gossipcc::testing::RunRanksWithStore;

constexpr int kHosts = 2;
constexpr int kPerHost = 2;
constexpr int kRanks = kHosts * kPerHost;
constexpr size_t kCount = 300001;  // 1.2 MB of float32: past the direct all-reduce, on the rings

float Value(int rank, int step, size_t i) {
  return static_cast<float>(std::sin(0.013 * static_cast<double>(i) + 0.7 * rank + 1.9 * step) * (rank + 1));
}

TEST(AllreduceAlgorithmsOnHostsTest, ElasticAveragingFollowsItsDefinition) {
  constexpr double kAlpha = 0.3;
  constexpr int kSteps = 3;
  std::mutex mu;
  std::vector<std::vector<float>> got(kRanks);
  std::vector<std::vector<double>> centers(kRanks);
  RunRanksWithStore(kRanks, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(kHosts, kPerHost, rank, store);
    EXPECT_TRUE(comm->hierarchical()) << "rank " << rank;
    std::vector<float> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = Value(0, 0, i);  // Initialize: rank 0's everywhere
    ElasticAveraging ea(1, kAlpha);
    ea.Initialize(*comm, {CpuBuffer(x.data(), kCount)});
    for (int step = 1; step <= kSteps; ++step) {
      for (size_t i = 0; i < kCount; ++i) x[i] += Value(rank, step, i);  // a local update
      EXPECT_TRUE(ea.Step(*comm, {CpuBuffer(x.data(), kCount)}));
    }
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = x;
    centers[rank] = ea.center();
  });

  std::vector<std::vector<double>> x(kRanks, std::vector<double>(kCount));
  std::vector<double> c(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    c[i] = Value(0, 0, i);
    for (int r = 0; r < kRanks; ++r) x[r][i] = Value(0, 0, i);
  }
  for (int step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < kCount; ++i) {
      double sum = 0;
      for (int r = 0; r < kRanks; ++r) {
        x[r][i] += Value(r, step, i);
        const double d = kAlpha * (x[r][i] - c[i]);
        x[r][i] -= d;
        sum += d;
      }
      c[i] += sum;
    }
  }
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < kCount; ++i) {
      if (std::fabs(got[r][i] - x[r][i]) > 1e-4 || std::fabs(centers[r][i] - c[i]) > 1e-4) {
        FAIL() << "rank " << r << ", element " << i << ": x " << got[r][i] << " (want " << x[r][i] << "), center "
               << centers[r][i] << " (want " << c[i] << ")";
      }
    }
    EXPECT_EQ(centers[r], centers[0]) << "rank " << r << ": every rank's center the same";
  }
}

TEST(AllreduceAlgorithmsOnHostsTest, UnevenAllreduceAveragesOverTheContributors) {
  std::mutex mu;
  std::vector<std::vector<float>> got(kRanks);
  std::vector<int> contributors(kRanks);
  RunRanksWithStore(kRanks, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(kHosts, kPerHost, rank, store);
    EXPECT_TRUE(comm->hierarchical()) << "rank " << rank;
    UnevenAllReduceSGD sgd;
    std::vector<float> g(kCount);
    for (size_t i = 0; i < kCount; ++i) g[i] = Value(rank, 0, i);
    UnevenAllReduceSGD::StepResult result;
    if (rank == 3) {  // finished: joins with zeros
      EXPECT_TRUE(sgd.JoinUntilAllDone(*comm, {CpuBuffer(g.data(), kCount)}));
    } else {
      result = sgd.SumAndNormalizeGradients(*comm, {CpuBuffer(g.data(), kCount)});
    }
    std::lock_guard<std::mutex> lock(mu);
    got[rank] = g;
    contributors[rank] = result.contributors;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(contributors[r], 3) << "rank " << r;
    for (size_t i = 0; i < kCount; ++i) {
      const double want = (static_cast<double>(Value(0, 0, i)) + Value(1, 0, i) + Value(2, 0, i)) / 3;
      if (std::fabs(got[r][i] - want) > 1e-5) FAIL() << "rank " << r << ", element " << i << ": " << got[r][i] << ", want " << want;
    }
  }
}

}  // namespace
}  // namespace gossipcc
