// UnevenAllReduceSGD end to end on 3 ranks: SGD on a small linear model where rank r runs its
// own number of steps, then SynchronizeParameters. Every rank's final parameters are compared,
// bit for bit, with a single-threaded reference that replays every rank's trajectory without
// a communicator: at step k the ranks with more than k steps contribute their gradients, the
// step's gradient is their sum divided by their number, each of them applies it with its own
// learning rate, and at the end every rank holds the parameters of the rank with the most
// steps (the highest rank among ties; rank 0 when nobody stepped), torch-distlearn's
// synchronizeParameters. Gradients are rounded to multiples of 2^-10 (small magnitudes), so
// that their cross-rank sum is exact in float32 whatever order the all-reduce adds them in:
// the reference need not know the ring's summation order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "algorithms/uneven_allreduce_sgd.h"
#include "comm/core/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::HasSubstr;

constexpr int kRanks = 3;
constexpr int kDim = 4;              // weights; the bias is the last parameter
constexpr int kParams = kDim + 1;
constexpr int kBatch = 3;

using Params = std::vector<float>;

// The sample of rank r at its step k: kBatch rows of kDim features in [-1, 1], targets from a
// fixed teacher, all small.
void Sample(int rank, int step, int row, float* x, float* y) {
  double t = 0.5;
  for (int j = 0; j < kDim; ++j) {
    x[j] = static_cast<float>(std::sin(1.3 * rank + 0.7 * step + 0.31 * row + 1.1 * j));
    t += (j % 2 ? -0.8 : 0.6) * x[j];
  }
  *y = static_cast<float>(t);
}

// d/dp of the batch's mean squared error of y ~ w.x + b, rounded to multiples of 2^-10.
std::vector<float> Gradient(const Params& p, int rank, int step) {
  std::vector<double> g(kParams, 0.0);
  for (int row = 0; row < kBatch; ++row) {
    float x[kDim], y;
    Sample(rank, step, row, x, &y);
    double pred = p[kDim];
    for (int j = 0; j < kDim; ++j) pred += static_cast<double>(p[j]) * x[j];
    const double d = 2.0 * (pred - y) / kBatch;
    for (int j = 0; j < kDim; ++j) g[j] += d * x[j];
    g[kDim] += d;
  }
  std::vector<float> out(kParams);
  for (int j = 0; j < kParams; ++j) out[j] = static_cast<float>(std::round(g[j] * 1024.0) / 1024.0);
  return out;
}

void SgdStep(Params& p, const std::vector<float>& g, float lr) {
  for (int j = 0; j < kParams; ++j) p[j] = p[j] - lr * g[j];
}

struct Case {
  std::string name;
  std::vector<int> steps;    // per rank, this epoch
  std::vector<float> lr;     // per rank (different rates make tied ranks' parameters differ)
  int expected_winner;       // by the rule, stated independently of Winner()
};

// Replays one epoch of every rank from `start` (per rank) and returns every rank's parameters
// before the synchronisation.
std::vector<Params> ReferenceEpoch(const std::vector<Params>& start, const Case& c) {
  std::vector<Params> p = start;
  int longest = 0;
  for (int s : c.steps) longest = std::max(longest, s);
  for (int k = 0; k < longest; ++k) {
    std::vector<int> contributing;
    for (int r = 0; r < kRanks; ++r) {
      if (c.steps[r] > k) contributing.push_back(r);
    }
    std::vector<float> sum(kParams, 0.0f);
    for (int r : contributing) {
      const std::vector<float> g = Gradient(p[r], r, k);
      for (int j = 0; j < kParams; ++j) sum[j] += g[j];  // exact: multiples of 2^-10, small
    }
    std::vector<float> mean(kParams);
    for (int j = 0; j < kParams; ++j) mean[j] = sum[j] / static_cast<float>(contributing.size());
    for (int r : contributing) SgdStep(p[r], mean, c.lr[r]);
  }
  return p;
}

std::string Show(const Params& p) { return absl::StrJoin(p, ", "); }

bool BitwiseEqual(const Params& a, const Params& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class UnevenAllReduceSGDTest : public ::testing::TestWithParam<LaunchMode> {};

// Two epochs on the same object: the second epoch's winner is decided by the steps since the
// first synchronisation only (rank 0 wins it although rank 2 has the most steps overall).
void RunEpochs(LaunchMode mode, const Case& first, const Case& second, const std::vector<Params>& start) {
  std::vector<Params> expect1 = ReferenceEpoch(start, first);
  const Params winner1 = expect1[first.expected_winner];
  std::vector<Params> expect2 = ReferenceEpoch(std::vector<Params>(kRanks, winner1), second);
  const Params winner2 = expect2[second.expected_winner];
  // The checks mean something only where the winner's parameters differ from every other
  // rank's and from their mean (what SynchronizeParameters computed before it followed
  // torch-distlearn).
  for (const auto& [c, expect, winner] : {std::make_tuple(&first, &expect1, &winner1),
                                          std::make_tuple(&second, &expect2, &winner2)}) {
    for (int r = 0; r < kRanks; ++r) {
      if (r != c->expected_winner && c->steps[r] != c->steps[c->expected_winner]) {
        EXPECT_FALSE(BitwiseEqual((*expect)[r], *winner)) << c->name << ": rank " << r << " equals the winner";
      }
    }
    double apart = 0;
    for (int j = 0; j < kParams; ++j) {
      double mean = 0;
      for (int r = 0; r < kRanks; ++r) mean += (*expect)[r][j] / kRanks;
      apart = std::max(apart, std::abs(mean - (*winner)[j]));
    }
    EXPECT_GT(apart, 1e-3) << c->name << ": the ranks' mean is no test";
  }

  RunRanks(kRanks, mode, [&](Communicator& comm) {
    const int rank = comm.rank();
    UnevenAllReduceSGD sgd;
    Params p = start[rank];
    int epoch_index = 0;
    for (const Case* c : {&first, &second}) {
      const std::string where = absl::StrCat(c->name, ", rank ", rank);
      for (int k = 0; k < c->steps[rank]; ++k) {
        std::vector<float> g = Gradient(p, rank, k);
        const auto r = sgd.SumAndNormalizeGradients(comm, {CpuBuffer(g.data(), g.size())});
        int expect_contributors = 0;
        for (int q = 0; q < kRanks; ++q) expect_contributors += c->steps[q] > k;
        EXPECT_EQ(r.contributors, expect_contributors) << where << ", step " << k;
        SgdStep(p, g, c->lr[rank]);
      }
      std::vector<float> scratch(kParams);
      while (sgd.JoinUntilAllDone(comm, {CpuBuffer(scratch.data(), scratch.size())})) {
      }
      EXPECT_EQ(sgd.steps_since_sync(), c->steps[rank]) << where;
      const int winner = sgd.SynchronizeParameters(comm, {CpuBuffer(p.data(), p.size())});
      EXPECT_EQ(winner, c->expected_winner) << where;
      EXPECT_EQ(sgd.steps_since_sync(), 0) << where;
      const Params& expect = epoch_index == 0 ? winner1 : winner2;
      EXPECT_TRUE(BitwiseEqual(p, expect)) << where << ": got " << Show(p) << "; the winner's are " << Show(expect);
      ++epoch_index;
    }
    EXPECT_EQ(sgd.steps_contributed(), first.steps[rank] + second.steps[rank]);
  });
}

const std::vector<Params> kSameStart(kRanks, Params{0.1f, -0.2f, 0.05f, 0.3f, 0.0f});

// 3, 5 and 7 steps at one learning rate: rank 2 ran every step; ranks 0 and 1 stopped with
// stale parameters, which finish() must not mix in. Then an epoch of 2, 1, 0 steps: rank 0.
TEST_P(UnevenAllReduceSGDTest, MostStepsWins) {
  RunEpochs(GetParam(), Case{"3/5/7 steps", {3, 5, 7}, {0.1f, 0.1f, 0.1f}, 2},
            Case{"then 2/1/0 steps", {2, 1, 0}, {0.1f, 0.1f, 0.1f}, 0}, kSameStart);
}

// Ties: ranks 0 and 2 both run 7 steps but with different learning rates, so their parameters
// differ and the tie rule shows: the highest of the tied ranks wins. Then 4, 4, 1: rank 1.
TEST_P(UnevenAllReduceSGDTest, TieGoesToHighestRank) {
  RunEpochs(GetParam(), Case{"7/5/7 steps", {7, 5, 7}, {0.05f, 0.1f, 0.15f}, 2},
            Case{"then 4/4/1 steps", {4, 4, 1}, {0.05f, 0.1f, 0.15f}, 1}, kSameStart);
}

// Nobody stepped: rank 0's parameters (torch-distlearn scatters from the root), even where
// the ranks started apart. Then 0, 3, 2 steps: a rank without a step can lose to the others.
TEST_P(UnevenAllReduceSGDTest, NoStepsGivesRankZero) {
  const std::vector<Params> apart = {Params{0.1f, -0.2f, 0.05f, 0.3f, 0.0f}, Params{0.4f, 0.1f, -0.3f, 0.2f, 0.5f},
                                     Params{-0.5f, 0.2f, 0.1f, -0.1f, 0.25f}};
  RunEpochs(GetParam(), Case{"no steps", {0, 0, 0}, {0.1f, 0.1f, 0.1f}, 0},
            Case{"then 0/3/2 steps", {0, 3, 2}, {0.1f, 0.1f, 0.1f}, 1}, apart);
}

INSTANTIATE_TEST_SUITE_P(Modes, UnevenAllReduceSGDTest,
                         ::testing::ValuesIn(LaunchModes()),
                         [](const ::testing::TestParamInfo<LaunchMode>& info) { return LaunchModeName(info.param); });

TEST(UnevenAllReduceSGDWinner, Rule) {
  EXPECT_EQ(UnevenAllReduceSGD::Winner({3, 5, 7}), 2);
  EXPECT_EQ(UnevenAllReduceSGD::Winner({7, 5, 3}), 0);
  EXPECT_EQ(UnevenAllReduceSGD::Winner({7, 5, 7}), 2);
  EXPECT_EQ(UnevenAllReduceSGD::Winner({4, 4, 1}), 1);
  EXPECT_EQ(UnevenAllReduceSGD::Winner({0, 0, 0}), 0);
  EXPECT_EQ(UnevenAllReduceSGD::Winner({0, 0, 1}), 2);
  EXPECT_EQ(UnevenAllReduceSGD::Winner({5}), 0);
  try {
    UnevenAllReduceSGD::Winner({});
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no step counts"));
  }
  try {
    UnevenAllReduceSGD::Winner({2, -1});
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1 reports -1 steps"));
  }
}

TEST(UnevenAllReduceSGDRestore, ValidatesCounters) {
  UnevenAllReduceSGD sgd;
  sgd.Restore(5, 7, 3);
  EXPECT_EQ(sgd.steps_contributed(), 5);
  EXPECT_EQ(sgd.collectives(), 7);
  EXPECT_EQ(sgd.steps_since_sync(), 3);
  for (const auto& [steps, collectives, since] : {std::make_tuple(5, 4, 0), std::make_tuple(2, 3, 4),
                                                  std::make_tuple(1, 1, -1), std::make_tuple(-1, 0, 0)}) {
    try {
      sgd.Restore(steps, collectives, since);
      ADD_FAILURE() << "no throw for " << steps << ", " << collectives << ", " << since;
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), HasSubstr("need 0 <= steps_since_sync <= steps_contributed <= collectives"));
    }
  }
  EXPECT_EQ(sgd.steps_since_sync(), 3) << "a refused restore changes nothing";
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
