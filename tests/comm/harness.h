// Runs N ranks of a test inside one gtest case: as threads of this process (Gloo HashStore)
// or as forked processes (Gloo FileStore in a fresh directory), all over loopback.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <tuple>

#include "comm/communicator.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace testing {

enum class LaunchMode { kThreads, kProcesses };
std::string LaunchModeName(LaunchMode mode);
// Test names for suites parameterised by (launch mode, rank count): "threads_n4".
std::string ModeAndRanksName(const ::testing::TestParamInfo<std::tuple<LaunchMode, int>>& info);

// Creates a Communicator per rank and calls body(comm) on each. gtest failures inside a
// rank fail the test (in process mode the child's exit status carries them). Each rank
// must finish within `deadline`, else the test fails: processes are killed; threads cannot
// be, so the test binary aborts naming the ranks (rather than hang until Bazel's timeout).
void RunRanks(int n, LaunchMode mode, const std::function<void(Communicator&)>& body,
              CommunicatorOptions options = {}, std::chrono::milliseconds deadline = std::chrono::seconds(120));

// As RunRanks, but creates no Communicator: body(rank, store) does.
void RunRanksWithStore(int n, LaunchMode mode, const std::function<void(int, std::shared_ptr<Store>)>& body,
                       std::chrono::milliseconds deadline = std::chrono::seconds(120));

// Ranks that disagree on a setting that decides the connections: creates a communicator on
// each of n ranks (threads) with options_for(rank) and expects every rank to fail with
// InvalidArgumentError naming "rank r of n", `setting` and expected_for(rank), within 10 s (a
// disagreement must not wait out the timeout).
void ExpectCreateFailsOnEveryRank(int n, const std::function<CommunicatorOptions(int)>& options_for,
                                  const std::string& setting, const std::function<std::string(int)>& expected_for);

// A directory unique to this call, under the test's temporary directory.
std::string FreshTempDir();

}  // namespace testing
}  // namespace gossipcc
