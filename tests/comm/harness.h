// Runs N ranks of a test inside one gtest case: as threads of this process (Gloo HashStore)
// or as forked processes (Gloo FileStore in a fresh directory), all over loopback.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace testing {

// Which sanitizer this build runs under (.bazelrc's asan and tsan configs; GCC defines
// __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__ there, Clang answers __has_feature). Such builds run
// 5-15x slower (TSan the most), so the large cases run at sizes that take the same code paths in
// less time, and the rank sweeps split their cases between the two sanitizers (InRankSweep).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizerBuild = true;
#else
inline constexpr bool kAddressSanitizerBuild = false;
#endif
#else
inline constexpr bool kAddressSanitizerBuild = false;
#endif
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizerBuild = true;
#else
inline constexpr bool kThreadSanitizerBuild = false;
#endif
#else
inline constexpr bool kThreadSanitizerBuild = false;
#endif
inline constexpr bool kSanitizerBuild = kAddressSanitizerBuild || kThreadSanitizerBuild;

// True when the environment has GOSSIPCC_FULL_SUITE=1 (tools/test.sh passes it on to the tests
// with GOSSIPCC_FULL_SUITE=1): the sanitizer builds then run each rank sweep and launch mode as
// the plain build does, not split between them (InSanitizerRankCounts, InRankSweep, LaunchModes).
inline bool FullSuite() {
  static const bool full = [] {
    const char* v = std::getenv("GOSSIPCC_FULL_SUITE");
    return v != nullptr && std::string(v) == "1";
  }();
  return full;
}

// Rank counts 1..8 split between the sanitizer builds: AddressSanitizer+UBSan n = 5..8 (the
// largest layouts: most ring chunks and graph wrap-arounds, odd and even, a power of two),
// ThreadSanitizer n = 1..4 (one rank, odd and even, powers of two; races are about the threads,
// not n). Each half holds odd and even n and every n mod 3, so suites that thin their cases under
// sanitizers by (case + n) % 3 still run every case in each build, at odd and at even n. Outside
// sanitizers, and with FullSuite(), every n.
inline bool InSanitizerRankCounts(int n) {
  if (FullSuite()) return true;
  if (kAddressSanitizerBuild) return n >= 5;
  if (kThreadSanitizerBuild) return n <= 4;
  return true;
}

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
// this build. The code under test is the same in both launch modes but for the store and the
// address spaces, so process mode (fork + FileStore, each rank its own address space) runs at a
// few n only: it was most of these suites' time.
// - Plain build (and sanitizer builds with FullSuite()): threads at every n = 1..8; processes at
//   n = 2 and 5 (even and odd).
// - AddressSanitizer+UBSan: threads at n = 5..8 and processes at n = 2 (the launch path of its
//   own, at the cheapest n).
// - ThreadSanitizer: threads at n = 1..4; no process mode: a rank's threads are the same in both
//   modes, and ranks as threads of one process share more (globals, the allocator) than forked
//   ones.
// Between the two sanitizers every n runs (InSanitizerRankCounts); every layout that depends on
// n (ring chunks and eager limits, graphs' wrap-around) runs at every n in the plain build.
inline bool InRankSweep(LaunchMode mode, int n) {
  if (mode == LaunchMode::kThreads) return InSanitizerRankCounts(n);
  if (FullSuite() || !kSanitizerBuild) return n == 2 || n == 5;
  return kAddressSanitizerBuild && n == 2;
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

// The launch modes of the suites parameterised by launch mode alone (ErrorsTest, BadInputTest,
// ...): both in the plain build and with FullSuite(); under a sanitizer one each, so that every
// case still runs under both sanitizers: process mode under AddressSanitizer+UBSan (what only
// that mode has: fork, FileStore, a peer's exit), threads under ThreadSanitizer (as in
// InRankSweep).
inline std::vector<LaunchMode> LaunchModes() {
  if (FullSuite() || !kSanitizerBuild) return {LaunchMode::kThreads, LaunchMode::kProcesses};
  if (kAddressSanitizerBuild) return {LaunchMode::kProcesses};
  return {LaunchMode::kThreads};
}

// For a case that the sanitizer builds share out whole (each runs under one of them unless
// FullSuite(); always in the plain build): whether this build leaves it to the other sanitizer.
// The case then skips, saying where it runs.
enum class Sanitizer { kAddress, kThread };
inline bool LeftToTheOtherSanitizer(Sanitizer runs_under) {
  if (!kSanitizerBuild || FullSuite()) return false;
  return runs_under == Sanitizer::kAddress ? !kAddressSanitizerBuild : !kThreadSanitizerBuild;
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

// Returns once all n ranks have called it with the same `key` (through `store`, whose wait is
// 120 s): for a test whose operation timeout is short on purpose (a failure named quickly), so
// that the timeout bounds the operations and not how far apart the ranks finished starting.
void MeetThroughStore(Store& store, int rank, int n, const std::string& key);

// H hosts of G ranks, for suites parameterised by layout (CreateOnHosts places them).
struct HostLayout {
  int hosts;
  int per_host;
  int size() const { return hosts * per_host; }
};
// "4x2".
std::string HostLayoutName(const ::testing::TestParamInfo<HostLayout>& info);

// Rank `rank` of `hosts` x `per_host` ranks, ranks r*G .. r*G+G-1 on host r (a host key per
// host: as if each host were a machine), created on `store` (rendezvous timeout 60 s).
std::unique_ptr<Communicator> CreateOnHosts(int hosts, int per_host, int rank, std::shared_ptr<Store> store,
                                            std::chrono::milliseconds timeout = std::chrono::seconds(60));

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
