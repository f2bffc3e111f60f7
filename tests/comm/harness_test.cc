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

TEST(HarnessTest, ProcessRankPastItsDeadlineIsKilledAndNamed) {
  EXPECT_NONFATAL_FAILURE(
      RunRanksWithStore(
          2, LaunchMode::kProcesses,
          [](int rank, std::shared_ptr<Store>) {
            if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
          },
          milliseconds(300)),
      "rank 1 did not finish within 300 ms (killed)");
}

TEST(HarnessDeathTest, ThreadRankPastItsDeadlineAbortsNamingIt) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_DEATH(RunRanksWithStore(
                   3, LaunchMode::kThreads,
                   [](int rank, std::shared_ptr<Store>) {
                     if (rank == 2) std::this_thread::sleep_for(std::chrono::seconds(30));
                   },
                   milliseconds(300)),
               "rank\\(s\\) 2 did not finish within 300 ms");
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
