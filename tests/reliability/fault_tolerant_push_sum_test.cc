// FaultTolerantPushSum: ranks (separate processes) are SIGKILLed or SIGSTOPped mid-run; the
// survivors recover, agree on the same membership, keep stepping, and
//  - their sum of w is exactly the number of survivors and their sum of x exactly the sum of
//    their own initial values (the dead ranks' mass and everything exchanged with them is
//    accounted for), up to float64 rounding;
//  - the de-biased x / w of every survivor converges to the survivors' average.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "algorithms/fault_tolerant_push_sum.h"
#include "comm/core/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::ElementsAreArray;
using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

constexpr int64_t kSteps = 80;
constexpr std::chrono::seconds kSurvivorDeadline{300};

// The step the main thread is in (for faults raised from a helper thread mid-step).
std::atomic<int64_t> g_step{-1};

double Initial(int rank, size_t e) { return (rank + 1.0) * (static_cast<double>(e % 97) + 1.0) + 0.5 * rank * rank; }

// Set by a test before it forks its ranks (they inherit it): FaultTolerantPushSumOptions::settle_rounds.
int g_settle_rounds = 0;
// Likewise: the loop counts its own Step calls instead of reading step().
bool g_loop_by_count = false;

FaultTolerantPushSumOptions Options() {
  FaultTolerantPushSumOptions o;
  o.graph = "exponential";
  // Under a sanitizer (5-15x slower) on a loaded 2-core machine the connects of a recovery
  // alone took over 1.5 s: their rendezvous timed out and the cases failed for that.
  o.comm.timeout = Ms(kSanitizerBuild ? 5000 : 1500);
  o.settle_rounds = g_settle_rounds;
  return o;
}

// A fault: `rank` gets `signal` when its step counter reaches `at_step`: raised on the main
// thread between steps, or (mid_step) from a helper thread `after` the main thread entered
// that step, while its messages are in flight.
struct Fault {
  int rank;
  int signal;
  int64_t at_step;
  bool mid_step = false;
  Ms after{0};
};

// The body of one rank; returns its exit status.
int RankMain(int rank, int n, const std::string& dir, const std::vector<Fault>& faults, size_t count) {
  FaultTolerantPushSum ps(MakeFileStore(dir), rank, n, Options());
  std::vector<double> x(count);
  for (size_t e = 0; e < count; ++e) x[e] = Initial(rank, e);
  for (const Fault& f : faults) {
    if (f.rank == rank && f.mid_step) {
      std::thread([f] {
        while (g_step.load() < f.at_step) std::this_thread::sleep_for(Ms(1));
        std::this_thread::sleep_for(f.after);
        raise(f.signal);
      }).detach();
    }
  }
  int recoveries = 0;
  int64_t check_at = -1;
  // Loops are driven by step() or (g_loop_by_count) by a count of calls: either way every
  // survivor makes kSteps calls, paired with the others' although some had completed one more
  // round than others when the failure struck.
  for (int64_t calls = 0; g_loop_by_count ? calls < kSteps : ps.step() < kSteps; ++calls) {
    for (const Fault& f : faults) {
      if (f.rank == rank && !f.mid_step && f.at_step == ps.step()) raise(f.signal);
    }
    g_step.store(ps.step());
    EXPECT_EQ(ps.step(), calls) << "rank " << rank;
    if (!ps.Step({CpuBuffer(x.data(), count)})) {
      ++recoveries;
      std::cout << "rank " << rank << " recovered into epoch " << ps.epoch() << " at step " << ps.step()
                << ": members {" << absl::StrJoin(ps.members(), ",") << "}, weight correction "
                << ps.last_recovery().weight_correction << std::endl;
      // Settling: the exponential graph is regular at every step, so the recovering Step mixes
      // until this rank's weight is within the tolerance of 1 (the round a rank may owe after it
      // mixes weights within the tolerance: they stay within it).
      if (g_settle_rounds > 0) {
        EXPECT_NEAR(ps.weight(), 1.0, Options().settle_tolerance) << "rank " << rank << " after epoch " << ps.epoch();
      }
      check_at = ps.last_recovery().step + 1;
    }
    // At the first step boundary after each recovery that every survivor reaches with the same
    // calls made (a rank that owed the agreed step's round reaches it in the recovering Step,
    // the others in their next), the survivors' weights add up to their number.
    if (ps.step() == check_at) {
      double w = ps.weight();
      ps.comm().allreduce(CpuBuffer(&w, 1))->wait();
      EXPECT_NEAR(w, static_cast<double>(ps.members().size()), 1e-12) << "after epoch " << ps.epoch();
      check_at = -1;
    }
  }
  std::set<int> dead;
  for (const Fault& f : faults) dead.insert(f.rank);
  std::vector<int> survivors;
  for (int r = 0; r < n; ++r) {
    if (!dead.count(r)) survivors.push_back(r);
  }
  EXPECT_EQ(ps.step(), kSteps);
  EXPECT_EQ(ps.members(), survivors);
  EXPECT_THAT(ps.dead(), ElementsAreArray(dead));
  EXPECT_TRUE(ps.departed().empty());
  EXPECT_GE(recoveries, 1);
  // Accounting: sums over the survivors.
  std::vector<double> sums(x);
  sums.push_back(ps.weight());
  ps.comm().allreduce(CpuBuffer(sums.data(), sums.size()))->wait();
  EXPECT_NEAR(sums[count], static_cast<double>(survivors.size()), 1e-12) << "sum of w";
  double worst = 0, worst_z = 0;
  std::vector<double> z(count);
  ps.Debias(CpuBuffer(x.data(), count), CpuBuffer(z.data(), count));
  for (size_t e = 0; e < count; ++e) {
    double expected = 0;
    for (int r : survivors) expected += Initial(r, e);
    worst = std::max(worst, std::abs(sums[e] - expected) / std::abs(expected));
    const double avg = expected / static_cast<double>(survivors.size());
    worst_z = std::max(worst_z, std::abs(z[e] - avg) / std::abs(avg));
  }
  EXPECT_LT(worst, 1e-12) << "sum of x vs the survivors' initial sum (relative)";
  EXPECT_LT(worst_z, 1e-9) << "de-biased value vs the survivors' average (relative)";
  std::cout << "rank " << rank << ": sum x rel. error " << worst << ", sum w " << sums[count]
            << ", |z - survivors' average| rel. " << worst_z << std::endl;
  return ::testing::Test::HasFailure() ? 1 : 0;
}

void RunWithFaults(int n, const std::vector<Fault>& faults, size_t count) {
  const std::string dir = FreshTempDir();
  std::cout.flush();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 3;
      try {
        code = RankMain(r, n, dir, faults, count);
      } catch (const std::exception& e) {
        std::cerr << "rank " << r << " threw: " << e.what() << std::endl;
      }
      std::cout.flush();
      std::cerr.flush();
      _exit(code);
    }
    ASSERT_GT(pid, 0);
    pids.push_back(pid);
  }
  std::set<int> victims;
  for (const Fault& f : faults) victims.insert(f.rank);
  // A safety net against a hung survivor, not a speed check: 12x what the slowest case took under
  // TSan on a loaded 2-core machine (25 s), below Bazel's timeout (large: 900 s) for the cases
  // together.
  const auto deadline = Clock::now() + kSurvivorDeadline;
  for (int r = 0; r < n; ++r) {
    if (victims.count(r)) continue;
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(pids[r], &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(Ms(5));
    }
    if (got == 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status, 0);
      ADD_FAILURE() << CurrentTestName() << ": survivor rank " << r << " of " << n << " did not finish within "
                    << kSurvivorDeadline.count() << " s (killed)";
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << CurrentTestName() << ": survivor rank " << r << " failed (status " << status << ")";
    }
  }
  for (int v : victims) {
    kill(pids[v], SIGKILL);
    waitpid(pids[v], nullptr, 0);
  }
}

TEST(FaultTolerantPushSumTest, RankKilledBetweenStepsIsDroppedAndMassIsAccounted) {
  if (LeftToTheOtherSanitizer(Sanitizer::kAddress)) GTEST_SKIP() << "runs under AddressSanitizer+UBSan (harness.h)";
  RunWithFaults(4, {{2, SIGKILL, /*at_step=*/12}}, 40);
}

TEST(FaultTolerantPushSumTest, SettlingAfterARecoveryBringsEveryWeightNearOne) {
  if (LeftToTheOtherSanitizer(Sanitizer::kThread)) GTEST_SKIP() << "runs under ThreadSanitizer (harness.h)";
  g_settle_rounds = 64;
  RunWithFaults(4, {{2, SIGKILL, /*at_step=*/12}}, 40);
  g_settle_rounds = 0;
}

// A loop that counts its own calls: the survivors' calls stay paired after the recovery (the
// final all-reduce of the sums is the check: a survivor one call ahead would leave the others'
// last round without a partner).
TEST(FaultTolerantPushSumTest, LoopCountingItsOwnCallsStaysPairedAfterARecovery) {
  if (LeftToTheOtherSanitizer(Sanitizer::kAddress)) GTEST_SKIP() << "runs under AddressSanitizer+UBSan (harness.h)";
  g_loop_by_count = true;
  g_settle_rounds = 64;
  RunWithFaults(4, {{2, SIGKILL, /*at_step=*/12}}, 40);
  RunWithFaults(5, {{3, SIGKILL, 8}, {0, SIGKILL, 30}}, 33);
  g_settle_rounds = 0;
  g_loop_by_count = false;
}

// A rank that leaves on purpose at consensus is departed, not dead: nothing exchanged with it
// is undone, so the survivors stay at the 4 ranks' average (had it been undone, they would go
// to their own 3 initial values' average, 25% away); it is not waited for; it takes no more steps.
TEST(FaultTolerantPushSumTest, ACleanLeaveIsNotADeath) {
  RunRanksWithStore(4, LaunchMode::kThreads, [](int rank, std::shared_ptr<Store> store) {
    auto ps = std::make_unique<FaultTolerantPushSum>(store, rank, 4, Options());
    std::vector<double> x(10);
    for (size_t e = 0; e < x.size(); ++e) x[e] = Initial(rank, e);
    auto average = [](size_t e, int n) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += Initial(r, e);
      return s / n;
    };
    while (ps->step() < 20) EXPECT_TRUE(ps->Step({CpuBuffer(x.data(), x.size())}));
    if (rank == 3) {
      ps->Leave();
      EXPECT_TRUE(ps->has_left());
      EXPECT_THROW(ps->Step({CpuBuffer(x.data(), x.size())}), InvalidArgumentError);
      ps.reset();  // the destructor leaves again: idempotent
      return;
    }
    int recoveries = 0;
    for (int i = 0; i < 20; ++i) recoveries += ps->Step({CpuBuffer(x.data(), x.size())}) ? 0 : 1;
    EXPECT_EQ(recoveries, 1);
    EXPECT_EQ(ps->step(), 40);
    EXPECT_EQ(ps->members(), (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(ps->departed(), (std::vector<int>{3}));
    EXPECT_TRUE(ps->dead().empty());
    std::vector<double> z(10);
    ps->Debias(CpuBuffer(x.data(), 10), CpuBuffer(z.data(), 10));
    for (size_t e = 0; e < z.size(); ++e) {
      EXPECT_NEAR(z[e], average(e, 4), 1e-9 * average(e, 4)) << "rank " << rank << " element " << e
                                                              << " (the 3 survivors' own average: " << average(e, 3)
                                                              << ")";
    }
  });
}

TEST(FaultTolerantPushSumTest, RankStoppedMidStepIsDroppedAndMassIsAccounted) {
  if (LeftToTheOtherSanitizer(Sanitizer::kThread)) GTEST_SKIP() << "runs under ThreadSanitizer (harness.h)";
  // Large messages so the stop lands while transfers are in flight.
  RunWithFaults(4, {{1, SIGSTOP, 20, /*mid_step=*/true, Ms(1)}}, 1 << 17);
}

TEST(FaultTolerantPushSumTest, TwoSuccessiveDeathsOnFiveRanks) {
  if (LeftToTheOtherSanitizer(Sanitizer::kAddress)) GTEST_SKIP() << "runs under AddressSanitizer+UBSan (harness.h)";
  RunWithFaults(5, {{3, SIGKILL, 8}, {0, SIGKILL, 30}}, 33);
}

// Without failures it is plain push-sum: sums conserved, average reached, no recovery.
TEST(FaultTolerantPushSumTest, WithoutFailuresBehavesAsPushSum) {
  RunRanksWithStore(4, LaunchMode::kThreads, [](int rank, std::shared_ptr<Store> store) {
    FaultTolerantPushSum ps(store, rank, 4, Options());
    std::vector<float> x(10);
    for (size_t e = 0; e < x.size(); ++e) x[e] = static_cast<float>(Initial(rank, e));
    while (ps.step() < 40) EXPECT_TRUE(ps.Step({CpuBuffer(x.data(), x.size())}));
    std::vector<float> z(10);
    ps.Debias(CpuBuffer(x.data(), 10), CpuBuffer(z.data(), 10));
    for (size_t e = 0; e < z.size(); ++e) {
      const double avg = (Initial(0, e) + Initial(1, e) + Initial(2, e) + Initial(3, e)) / 4;
      EXPECT_NEAR(z[e], avg, 1e-5 * avg);
    }
    EXPECT_EQ(ps.epoch(), 0);
    EXPECT_TRUE(ps.dead().empty());
    // Bad input is rejected before anything is sent; the group stays in step.
    std::vector<int32_t> ints(4);
    EXPECT_THROW(ps.Step({CpuBuffer(ints.data(), 4)}), InvalidArgumentError);
    std::vector<double> d(10);
    EXPECT_THROW(ps.Step({CpuBuffer(x.data(), 10), CpuBuffer(d.data(), 10)}), InvalidArgumentError);
    EXPECT_TRUE(ps.Step({CpuBuffer(x.data(), x.size())}));
  });
  EXPECT_THROW(FaultTolerantPushSum(MakeHashStore(), 0, 2, [] {
                 auto o = Options();
                 o.graph = "no-such-graph";
                 return o;
               }()),
               InvalidArgumentError);
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
