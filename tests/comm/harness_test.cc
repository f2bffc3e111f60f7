// The harness's own contract: a rank that overruns its deadline fails the test instead of
// hanging it, in both launch modes.
#include "tests/comm/harness.h"

#include <chrono>
#include <thread>

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace testing {
namespace {

using std::chrono::milliseconds;

// The ranks that are not late do nothing, so they finish in milliseconds: a deadline 100x that
// (on a loaded machine, under sanitizers) fires only on the late one.
constexpr milliseconds kDeadline{3000};

TEST(HarnessTest, ProcessRankPastItsDeadlineIsKilledAndNamed) {
  EXPECT_NONFATAL_FAILURE(
      RunRanksWithStore(
          2, LaunchMode::kProcesses,
          [](int rank, std::shared_ptr<Store>) {
            if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(300));
          },
          kDeadline),
      "HarnessTest.ProcessRankPastItsDeadlineIsKilledAndNamed: rank 1 of 2 did not finish within 3000 ms (killed)");
}

TEST(HarnessDeathTest, ThreadRankPastItsDeadlineAbortsNamingIt) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(RunRanksWithStore(
                   3, LaunchMode::kThreads,
                   [](int rank, std::shared_ptr<Store>) {
                     if (rank == 2) std::this_thread::sleep_for(std::chrono::seconds(300));
                   },
                   kDeadline),
               "HarnessDeathTest.ThreadRankPastItsDeadlineAbortsNamingIt: rank\\(s\\) 2 of 3 did not finish within "
               "3000 ms");
}

TEST(HarnessTest, RanksWithinTheirDeadlinePass) {
  for (LaunchMode mode : {LaunchMode::kThreads, LaunchMode::kProcesses}) {
    RunRanksWithStore(
        3, mode, [](int, std::shared_ptr<Store>) { std::this_thread::sleep_for(milliseconds(20)); },
        std::chrono::seconds(20));
  }
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
