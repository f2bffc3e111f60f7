// CallbackExecutor (comm/sched/callback_executor.h): ordered tasks start in ticket order
// whatever order they are posted in; a task that blocks until a later task has run does not
// deadlock (it yields the turn, or loses it after handoff_after); unordered tasks never wait
// for the order; Stop delivers everything posted, then no executor thread runs anything.
// Torch-free, so it also runs under the sanitizer configs.
#include "comm/sched/callback_executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace gossipcc {
namespace {

using namespace std::chrono_literals;

// A safety net far above the expected (sub-millisecond) waits: a failure names its case.
constexpr auto kSafetyNet = 60s;

// A one-shot event that a test can wait for with the safety net.
class Event {
 public:
  void Set() {
    std::lock_guard<std::mutex> lock(mu_);
    set_ = true;
    cv_.notify_all();
  }
  bool WaitFor(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

TEST(CallbackExecutorTest, OrderedTasksRunInTicketOrderWhateverThePostOrder) {
  CallbackExecutor executor("test");
  constexpr int kTasks = 200;
  std::vector<uint64_t> tickets;
  for (int i = 0; i < kTasks; ++i) tickets.push_back(executor.Reserve());
  std::vector<int> post_order(kTasks);
  for (int i = 0; i < kTasks; ++i) post_order[i] = i;
  std::shuffle(post_order.begin(), post_order.end(), std::mt19937(7));
  std::mutex mu;
  std::vector<int> ran;
  Event all_ran;
  for (int i : post_order) {
    executor.Post(tickets[i], [&, i] {
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(i);
      if (static_cast<int>(ran.size()) == kTasks) all_ran.Set();
    });
  }
  ASSERT_TRUE(all_ran.WaitFor(kSafetyNet)) << "ordered tasks: not all ran";
  std::vector<int> expected(kTasks);
  for (int i = 0; i < kTasks; ++i) expected[i] = i;
  EXPECT_EQ(ran, expected);
}

// PyTorch's powerSGD_hook: a callback issues an operation and blocks until that operation's
// own completion (a later ticket) has run. It yields the turn when it issues.
TEST(CallbackExecutorTest, ATaskThatYieldsThenWaitsForALaterTaskDoesNotDeadlock) {
  CallbackExecutor::Options options;
  options.handoff_after = std::chrono::hours(1);  // only the yield can make progress here
  CallbackExecutor executor("test", options);
  const uint64_t first = executor.Reserve();
  Event nested_ran, first_done;
  executor.Post(first, [&] {
    const uint64_t nested = executor.Reserve();  // "issues" an operation...
    CallbackExecutor::YieldTurn();               // ...and waits for it: as GossipccWork::wait does
    std::thread([&executor, nested, &nested_ran] { executor.Post(nested, [&] { nested_ran.Set(); }); }).detach();
    EXPECT_TRUE(nested_ran.WaitFor(kSafetyNet)) << "yield: the nested task never ran";
    first_done.Set();
  });
  ASSERT_TRUE(first_done.WaitFor(kSafetyNet)) << "yield: the first task never finished";
  executor.Stop(kSafetyNet);
}

// PyTorch's powerSGD_hook again, as the process group runs it: the operation issued while
// holding the turn is nested; its completion runs at once while the holder keeps the turn,
// even past handoff_after, so the next ordered task starts only once the holder is done.
TEST(CallbackExecutorTest, NestedOperationsCompleteWhileTheHolderKeepsTheTurn) {
  CallbackExecutor::Options options;
  options.handoff_after = std::chrono::milliseconds(200);  // the nested one takes 300 ms
  CallbackExecutor executor("test", options);
  EXPECT_FALSE(executor.HoldsTurn());
  const uint64_t first = executor.Reserve();
  const uint64_t second = executor.Reserve();
  std::mutex mu;
  std::vector<std::string> events;
  auto note = [&](const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  };
  Event second_ran;
  executor.Post(first, [&] {
    EXPECT_TRUE(executor.HoldsTurn());
    executor.NestedIssued();
    Event nested_done;
    std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // > handoff_after
      executor.PostNested([&] {
        note("nested");
        nested_done.Set();
      });
    }).detach();
    EXPECT_TRUE(nested_done.WaitFor(kSafetyNet)) << "nested: never completed";
    note("first done");
  });
  executor.Post(second, [&] {
    note("second");
    second_ran.Set();
  });
  ASSERT_TRUE(second_ran.WaitFor(kSafetyNet)) << "nested: the second task never ran";
  EXPECT_TRUE(executor.Stop(kSafetyNet));
  EXPECT_EQ(events, (std::vector<std::string>{"nested", "first done", "second"}));
}

// WaitForEarlierTasks (order_nested_collectives): returns only after every task reserved before
// the call has run to its end (even one that lost the turn), not before; a task reserved after
// the call is not waited for; a limit ends the wait with false.
TEST(CallbackExecutorTest, WaitForEarlierTasksWaitsForEveryEarlierTicketToEnd) {
  CallbackExecutor::Options options;
  options.handoff_after = std::chrono::milliseconds(50);  // the first task outlives its turn
  CallbackExecutor executor("test", options);
  const uint64_t first = executor.Reserve();
  const uint64_t second = executor.Reserve();
  Event release_first;
  std::atomic<int> ended{0};
  executor.Post(second, [&] { ended += 1; });
  // Not posted yet: the wait cannot end, and gives up at its limit.
  EXPECT_FALSE(executor.WaitForEarlierTasks(std::chrono::milliseconds(100))) << "wait: ended before the tasks ran";
  executor.Post(first, [&] {
    EXPECT_TRUE(release_first.WaitFor(kSafetyNet)) << "wait: never released";
    ended += 1;
  });
  std::atomic<bool> waited{false};
  std::thread waiter([&] {
    EXPECT_TRUE(executor.WaitForEarlierTasks(kSafetyNet)) << "wait: safety net fired";
    EXPECT_EQ(ended.load(), 2) << "wait: returned before both earlier tasks ended";
    waited = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the second runs, the first blocks
  EXPECT_FALSE(waited.load()) << "wait: returned while the first task still ran";
  const uint64_t later = executor.Reserve();  // reserved after the wait began: not waited for
  release_first.Set();
  waiter.join();
  EXPECT_TRUE(waited.load());
  executor.Post(later, [] {});
  EXPECT_TRUE(executor.WaitForEarlierTasks(kSafetyNet));
  EXPECT_TRUE(executor.Stop(kSafetyNet));
}

// A callback blocked on something the executor cannot see (no yield) loses the turn after
// handoff_after, so the later task still runs.
TEST(CallbackExecutorTest, ATaskBlockedWithoutYieldingLosesTheTurn) {
  CallbackExecutor::Options options;
  options.handoff_after = 20ms;
  CallbackExecutor executor("test", options);
  const uint64_t first = executor.Reserve();
  const uint64_t second = executor.Reserve();
  Event second_ran, first_done;
  executor.Post(first, [&] {
    EXPECT_TRUE(second_ran.WaitFor(kSafetyNet)) << "handoff: the second task never ran";
    first_done.Set();
  });
  executor.Post(second, [&] { second_ran.Set(); });
  ASSERT_TRUE(first_done.WaitFor(kSafetyNet)) << "handoff: the first task never finished";
}

TEST(CallbackExecutorTest, UnorderedTasksDoNotWaitForTheOrder) {
  CallbackExecutor executor("test");
  const uint64_t never_posted_yet = executor.Reserve();  // holds back every later ordered task
  Event ran;
  executor.PostUnordered([&] { ran.Set(); });
  EXPECT_TRUE(ran.WaitFor(kSafetyNet)) << "unordered: waited for an unposted ticket";
  executor.Post(never_posted_yet, [] {});
}

TEST(CallbackExecutorTest, ManyTasksBlockedAtOnceGetThreadsOfTheirOwn) {
  // Every task blocks until all of them run: only a thread per task can finish this.
  CallbackExecutor executor("test");
  constexpr int kTasks = 12;
  std::atomic<int> started{0};
  Event all_started;
  std::atomic<int> finished{0};
  for (int i = 0; i < kTasks; ++i) {
    executor.PostUnordered([&] {
      if (++started == kTasks) all_started.Set();
      EXPECT_TRUE(all_started.WaitFor(kSafetyNet)) << "threads: the executor did not grow";
      ++finished;
    });
  }
  EXPECT_TRUE(executor.Stop(kSafetyNet));
  EXPECT_EQ(finished.load(), kTasks);
  EXPECT_GE(executor.threads_started(), kTasks);
}

TEST(CallbackExecutorTest, RunIfTurnRunsTheTaskOnTheCallerWhenItsTurnHasCome) {
  CallbackExecutor executor("test");
  const uint64_t blocker = executor.Reserve();
  const uint64_t mine = executor.Reserve();
  std::thread::id ran_on;
  executor.Post(mine, [&] { ran_on = std::this_thread::get_id(); });
  EXPECT_FALSE(executor.RunIfTurn(mine)) << "ran before the earlier ticket";
  Event blocker_ran;
  // The blocker runs on an executor thread, and then `mine` right after it there too: either
  // way it runs exactly once.
  executor.Post(blocker, [&] { blocker_ran.Set(); });
  ASSERT_TRUE(blocker_ran.WaitFor(kSafetyNet));
  EXPECT_TRUE(executor.Stop(kSafetyNet));
  EXPECT_NE(ran_on, std::thread::id());

  CallbackExecutor inline_executor("test");
  const uint64_t t = inline_executor.Reserve();
  inline_executor.Post(t, [&] { ran_on = std::this_thread::get_id(); });
  // Posted with its turn come: an executor thread may take it first; if not, it runs here.
  if (inline_executor.RunIfTurn(t)) {
    EXPECT_EQ(ran_on, std::this_thread::get_id());
  }
  EXPECT_TRUE(inline_executor.Stop(kSafetyNet));
  EXPECT_NE(ran_on, std::thread::id());
}

TEST(CallbackExecutorTest, StopDeliversEverythingThenPostsRunInline) {
  CallbackExecutor executor("test");
  std::atomic<int> ran{0};
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 50; ++i) tickets.push_back(executor.Reserve());
  std::thread poster([&] {
    for (uint64_t t : tickets) {
      executor.Post(t, [&] {
        std::this_thread::sleep_for(100us);
        ++ran;
      });
    }
  });
  EXPECT_TRUE(executor.Stop(kSafetyNet)) << "stop: not drained";
  poster.join();
  EXPECT_EQ(ran.load(), 50);
  std::thread::id ran_on;
  executor.PostUnordered([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id()) << "a post after Stop must run on the posting thread";
}

TEST(CallbackExecutorTest, StopFromOneOfItsOwnTasksDoesNotWaitForItself) {
  auto executor = std::make_shared<CallbackExecutor>("test");
  Event stopped;
  executor->PostUnordered([&] {
    EXPECT_TRUE(executor->Stop(kSafetyNet));
    stopped.Set();
  });
  ASSERT_TRUE(stopped.WaitFor(kSafetyNet)) << "stop from a task: deadlocked";
  executor->Stop(kSafetyNet);
}

TEST(CallbackExecutorTest, ATaskThatThrowsIsReportedAndTheRestRun) {
  CallbackExecutor executor("test");
  const uint64_t a = executor.Reserve();
  const uint64_t b = executor.Reserve();
  Event b_ran;
  executor.Post(a, [] { throw std::runtime_error("callback failed"); });
  executor.Post(b, [&] { b_ran.Set(); });
  EXPECT_TRUE(b_ran.WaitFor(kSafetyNet)) << "throwing task: the next one never ran";
}

}  // namespace
}  // namespace gossipcc
