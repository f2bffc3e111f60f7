// Runs N ranks of a test inside one gtest case: as threads of this process (Gloo HashStore)
// or as forked processes (Gloo FileStore in a fresh directory), all over loopback.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace testing {

// True in builds with AddressSanitizer or ThreadSanitizer (.bazelrc's asan and tsan configs; GCC
// and Clang define these macros there). Such builds run 5-15x slower (TSan the most), so the
// large cases run at sizes that take the same code paths in less time.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// "Suite.Name" of the gtest case running now (with its parameter's name for a parameterised
// one), or "(no test)" outside one: for messages of safety nets, which must say which case fired.
std::string CurrentTestName();

// Runs `fn`, which must throw E: returns its message; anything else (no exception, another
// type) is a test failure naming the test, and returns "".
template <typename E, typename Fn>
std::string ExpectThrow(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << CurrentTestName() << ": wrong error type: " << e.what();
    return "";
  }
  ADD_FAILURE() << CurrentTestName() << ": expected an exception";
  return "";
}

enum class LaunchMode { kThreads, kProcesses };
std::string LaunchModeName(LaunchMode mode);
// Test names for suites parameterised by (launch mode, rank count): "threads_n4".
std::string ModeAndRanksName(const ::testing::TestParamInfo<std::tuple<LaunchMode, int>>& info);

// Whether the rank sweeps (the suites parameterised by launch mode and n = 1..8) run (mode, n) in
// this build. Every n runs, and both launch modes run; the code under test is the same in both
// modes but for the store and the address spaces, so process mode (fork + FileStore, each rank
// its own address space) runs at a few n only: it was most of these suites' time.
// - Plain build: threads at every n = 1..8; processes at n = 2 and 5 (even and odd).
// - Sanitizer build (kSanitizerBuild, 5-15x slower): threads at n = 1, 2, 3, 4, 6, 8 (one rank,
//   powers of two, odd and even non-powers of two) and processes at n = 2, 5, 7 (the counts the
//   threads skip), so each sanitizer still runs every layout that depends on n (ring chunks and
//   eager limits, graphs' wrap-around) and both launch paths.
inline bool InRankSweep(LaunchMode mode, int n) {
  if (mode == LaunchMode::kThreads) return !kSanitizerBuild || (n != 5 && n != 7);
  return kSanitizerBuild ? (n == 2 || n == 5 || n == 7) : (n == 2 || n == 5);
}

// The (launch mode, n) pairs for n = 1..8 that InRankSweep keeps, threads first.
inline std::vector<std::tuple<LaunchMode, int>> RankSweep() {
  std::vector<std::tuple<LaunchMode, int>> out;
  for (LaunchMode mode : {LaunchMode::kThreads, LaunchMode::kProcesses}) {
    for (int n = 1; n <= 8; ++n) {
      if (InRankSweep(mode, n)) out.emplace_back(mode, n);
    }
  }
  return out;
}

// Creates a Communicator per rank and calls body(comm) on each. gtest failures inside a
// rank fail the test (in process mode the child's exit status carries them). Each rank
// must finish within `deadline`, else the test fails: processes are killed; threads cannot
// be, so the test binary aborts (rather than hang until Bazel's timeout). Either way the
// message names the test case and the late ranks. The deadline is a safety net against a
// hang, not a speed check: keep it far (10x or more) above what the slowest stage (TSan on a
// loaded 2-core machine) takes, and below Bazel's timeout for the test's size.
void RunRanks(int n, LaunchMode mode, const std::function<void(Communicator&)>& body,
              CommunicatorOptions options = {}, std::chrono::milliseconds deadline = std::chrono::seconds(120));

// As RunRanks, but creates no Communicator: body(rank, store) does.
void RunRanksWithStore(int n, LaunchMode mode, const std::function<void(int, std::shared_ptr<Store>)>& body,
                       std::chrono::milliseconds deadline = std::chrono::seconds(120));

// Ranks that disagree on a setting that decides the connections: creates a communicator on
// each of n ranks (threads) with options_for(rank) and expects every rank to fail with
// InvalidArgumentError naming "rank r of n", `setting` and expected_for(rank), in less than
// half of the options' timeout (a disagreement must not wait the timeout out; it takes well
// under a second).
void ExpectCreateFailsOnEveryRank(int n, const std::function<CommunicatorOptions(int)>& options_for,
                                  const std::string& setting, const std::function<std::string(int)>& expected_for);

// A directory unique to this call, under the test's temporary directory.
std::string FreshTempDir();

// Fails (fatally: wrap a call whose caller goes on in ASSERT_NO_FATAL_FAILURE) unless `got` holds
// exactly the bits of `want` (so -0.0 vs 0.0 and NaN payloads count), naming the first element
// that differs.
inline void ExpectSameBits(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  if (want.empty() || std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0) return;
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &want[i], 4);
    std::memcpy(&b, &got[i], 4);
    ASSERT_EQ(a, b) << what << ": element " << i << ": want " << want[i] << ", got " << got[i];
  }
}

}  // namespace testing
}  // namespace gossipcc
