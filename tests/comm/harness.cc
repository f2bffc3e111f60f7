#include "tests/comm/harness.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "comm/core/errors.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace testing {

std::string CurrentTestName() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info == nullptr ? "(no test)" : absl::StrCat(info->test_suite_name(), ".", info->name());
}

std::string LaunchModeName(LaunchMode mode) { return mode == LaunchMode::kThreads ? "threads" : "processes"; }

std::string ModeAndRanksName(const ::testing::TestParamInfo<std::tuple<LaunchMode, int>>& info) {
  return absl::StrCat(LaunchModeName(std::get<0>(info.param)), "_n", std::get<1>(info.param));
}

void ExpectCreateFailsOnEveryRank(int n, const std::function<CommunicatorOptions(int)>& options_for,
                                  const std::string& setting, const std::function<std::string(int)>& expected_for) {
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    const CommunicatorOptions options = options_for(rank);
    const auto start = std::chrono::steady_clock::now();
    try {
      Communicator::Create(store, rank, n, options);
      ADD_FAILURE() << "rank " << rank << ": created a communicator with a disagreeing peer";
    } catch (const InvalidArgumentError& e) {
      const std::string what = e.what();
      for (const std::string& part : {absl::StrCat("rank ", rank, " of ", n), setting, expected_for(rank)}) {
        EXPECT_NE(what.find(part), std::string::npos) << "rank " << rank << ": no \"" << part << "\" in: " << what;
      }
    }
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    EXPECT_LT(took, options.timeout / 2) << CurrentTestName() << ": rank " << rank << " took " << took.count()
                                         << " ms to fail on a disagreement on " << setting << " (timeout "
                                         << options.timeout.count() << " ms)";
  });
}

void MeetThroughStore(Store& store, int rank, int n, const std::string& key) {
  store.set(absl::StrCat(key, "/", rank), {'y'});
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(absl::StrCat(key, "/", r));
  store.wait(keys, std::chrono::seconds(120));
}

std::string HostLayoutName(const ::testing::TestParamInfo<HostLayout>& info) {
  return absl::StrCat(info.param.hosts, "x", info.param.per_host);
}

std::unique_ptr<Communicator> CreateOnHosts(int hosts, int per_host, int rank, std::shared_ptr<Store> store,
                                            std::chrono::milliseconds timeout) {
  CommunicatorOptions o;
  o.host_key = absl::StrCat("host", rank / per_host);
  o.timeout = timeout;
  o.rendezvous_timeout = std::chrono::seconds(60);
  return Communicator::Create(std::make_shared<PrefixStore>("comm", std::move(store)), rank, hosts * per_host, o);
}

namespace {

int ThreadCount() {
  DIR* tasks = opendir("/proc/self/task");
  if (!tasks) return -1;
  int n = 0;
  while (const dirent* e = readdir(tasks)) n += e->d_name[0] != '.';
  closedir(tasks);
  return n;
}

// A child of fork() has only the forking thread; a lock another thread held at the fork (the
// allocator's, under the sanitizers) stays locked in the child forever. An earlier case's
// detached thread (a timed-out rendezvous's connect, which ends by itself within that
// rendezvous's timeout) must therefore be gone before ranks are forked. Waits for that, up to a
// bound far above a thread's exit; past it, says so and forks anyway. ThreadSanitizer's runtime
// keeps a background thread of its own once any thread has been created (and takes its locks
// around fork itself).
#if defined(__SANITIZE_THREAD__)
constexpr int kRuntimeThreads = 1;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int kRuntimeThreads = 1;
#else
constexpr int kRuntimeThreads = 0;
#endif
#else
constexpr int kRuntimeThreads = 0;
#endif

void WaitUntilSingleThreaded() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int threads = ThreadCount();
  while (threads > 1 + kRuntimeThreads && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    threads = ThreadCount();
  }
  if (threads > 1 + kRuntimeThreads) {
    std::cerr << CurrentTestName() << ": forking ranks with " << threads
              << " threads in the test process (an earlier case's threads did not end within 60 s)" << std::endl;
  }
}

}  // namespace

std::string FreshTempDir() {
  static std::atomic<int> counter{0};
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base ? base : "/tmp", "/gossipcc_", getpid(), "_", counter++);
  mkdir(dir.c_str(), 0700);
  return dir;
}

void RunRanksWithStore(int n, LaunchMode mode, const std::function<void(int, std::shared_ptr<Store>)>& body,
                       std::chrono::milliseconds deadline) {
  if (mode == LaunchMode::kThreads) {
    auto store = MakeHashStore();
    absl::Mutex mu;
    std::vector<bool> finished(n, false);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          body(r, store);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << " threw: " << e.what();
        }
        absl::MutexLock lock(&mu);
        finished[r] = true;
      });
    }
    {
      absl::MutexLock lock(&mu);
      const absl::Condition all_finished(
          +[](std::vector<bool>* f) { return std::all_of(f->begin(), f->end(), [](bool done) { return done; }); },
          &finished);
      if (!mu.AwaitWithTimeout(all_finished, absl::FromChrono(deadline))) {
        std::string late;
        for (int r = 0; r < n; ++r) {
          if (!finished[r]) absl::StrAppend(&late, late.empty() ? "" : ", ", r);
        }
        std::cerr << CurrentTestName() << ": rank(s) " << late << " of " << n << " did not finish within "
                  << deadline.count() << " ms; threads cannot be killed, so the test aborts" << std::endl;
        std::abort();
      }
    }
    for (auto& t : threads) t.join();
    return;
  }
  const std::string dir = FreshTempDir();
  WaitUntilSingleThreaded();
  std::cout.flush();
  std::cerr.flush();
  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        body(r, MakeFileStore(dir));
        code = ::testing::Test::HasFailure() ? 1 : 0;
      } catch (const std::exception& e) {
        std::cerr << "rank " << r << " threw: " << e.what() << std::endl;
        code = 2;
      }
      std::cout.flush();
      std::cerr.flush();
      _exit(code);
    }
    ASSERT_GT(pid, 0) << "fork failed";
    children.push_back(pid);
  }
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::vector<bool> done(n, false);
  int remaining = n;
  while (remaining > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int status = 0;
      pid_t got = waitpid(children[r], &status, WNOHANG);
      if (got == children[r]) {
        done[r] = true;
        --remaining;
        if (WIFEXITED(status)) {
          EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << r << " (pid " << children[r] << ") failed";
        } else {
          ADD_FAILURE() << "rank " << r << " died with signal " << WTERMSIG(status);
        }
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > until) {
      for (int r = 0; r < n; ++r) {
        if (!done[r]) {
          kill(children[r], SIGKILL);
          waitpid(children[r], nullptr, 0);
          ADD_FAILURE() << CurrentTestName() << ": rank " << r << " of " << n << " did not finish within "
                        << deadline.count() << " ms (killed)";
        }
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void RunRanks(int n, LaunchMode mode, const std::function<void(Communicator&)>& body, CommunicatorOptions options,
              std::chrono::milliseconds deadline) {
  RunRanksWithStore(
      n, mode,
      [&](int rank, std::shared_ptr<Store> store) {
        auto comm = Communicator::Create(store, rank, n, options);
        body(*comm);
      },
      deadline);
}

}  // namespace testing
}  // namespace gossipcc
