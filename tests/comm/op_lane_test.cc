// OpLane (comm/sched/op_lane.h): tasks run one at a time in order; plain collectives are
// issued at once unless a collective-issuing task is queued or running; Stop fails what is
// queued; a blocking Run on an idle lane runs on its caller's thread and holds the lane as a
// queued task would. Torch-free, so it also runs under the sanitizer configs.
#include "comm/sched/op_lane.h"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/core/errors.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace {

using namespace std::chrono_literals;

// A task that holds the lane until Release(); constructed once it has started, so what is
// submitted afterwards queues behind it (a slow start, e.g. under ASan, cannot reorder them).
class RunningTask {
 public:
  explicit RunningTask(OpLane& lane) {
    std::shared_future<void> gate = release_.get_future().share();
    work_ = lane.Submit("running", [gate, this] {
      started_.set_value();
      gate.wait();
    }, true);
    started_.get_future().wait();
  }
  void Release() { release_.set_value(); }
  Work& work() { return *work_; }

 private:
  std::promise<void> release_, started_;
  std::shared_ptr<Work> work_;
};

TEST(OpLaneTest, TasksRunInOrderAndReportErrors) {
  OpLane lane("test");
  std::vector<int> order;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 20; ++i) {
    works.push_back(lane.Submit("task " + std::to_string(i), [&order, i] { order.push_back(i); }, i % 2 == 0));
  }
  auto failing = lane.Submit("failing", [] { throw MismatchError("ranks disagree"); }, true);
  for (auto& w : works) w->wait();
  EXPECT_THROW(
      try { failing->wait(); } catch (const MismatchError& e) {
        EXPECT_STREQ(e.what(), "ranks disagree");
        throw;
      },
      MismatchError);
  std::vector<int> expected(20);
  for (int i = 0; i < 20; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
}

TEST(OpLaneTest, IssuesAtOnceWhenNoCollectiveTaskIsPending) {
  OpLane lane("test");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  // A running task that issues no collectives does not hold plain collectives back.
  auto p2p_task = lane.Submit("gossip round", [gate] { gate.wait(); }, /*uses_collectives=*/false);
  bool issued = false;
  auto inner = std::make_shared<CompletionWork>("inner");
  auto work = lane.Issue("allreduce", [&] {
    issued = true;
    return inner;
  });
  EXPECT_TRUE(issued);
  EXPECT_EQ(work, inner);
  release.set_value();
  p2p_task->wait();
  inner->Complete(nullptr);
}

TEST(OpLaneTest, DefersPlainCollectivesBehindCollectiveTasks) {
  OpLane lane("test");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> step{0};
  auto task = lane.Submit("powersgd", [&, gate] {
    gate.wait();
    step = 1;  // the task's own collectives are issued here
  }, /*uses_collectives=*/true);
  std::atomic<int> issued_after{-1};
  auto inner = std::make_shared<CompletionWork>("inner allreduce");
  auto work = lane.Issue("allreduce", [&] {
    issued_after = step.load();
    return inner;
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(issued_after.load(), -1) << "issued before the collective task";
  EXPECT_FALSE(work->is_completed());
  release.set_value();
  task->wait();
  // Issued (after the task), but completes only with the collective itself.
  for (int i = 0; i < 200 && issued_after.load() < 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(issued_after.load(), 1);
  EXPECT_FALSE(work->is_completed());
  inner->Complete(std::make_exception_ptr(TimeoutError("peer 3 late")));
  EXPECT_THROW(work->wait(), TimeoutError);
  // Nothing pending any more: issued at once again.
  bool now = false;
  auto inner2 = std::make_shared<CompletionWork>("inner 2");
  lane.Issue("barrier", [&] {
    now = true;
    return inner2;
  });
  EXPECT_TRUE(now);
  inner2->Complete(nullptr);
}

// A plain collective queued behind a collective task fails at its deadline while it still waits
// there, naming the lane and the task ahead; it is still issued in its turn (the communicator,
// given the same deadline, then fails it at once), and its outcome no longer changes the Work.
TEST(OpLaneTest, QueuedCollectiveFailsAtItsDeadlineAndStillIssuesInItsTurn) {
  OpLane lane("test lane");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  auto task = lane.Submit("slow algorithm", [gate] { gate.wait(); }, /*uses_collectives=*/true);
  std::atomic<bool> issued{false};
  auto inner = std::make_shared<CompletionWork>("inner allreduce");
  const auto start = std::chrono::steady_clock::now();
  auto work = lane.Issue("allreduce", start + 300ms, [&] {
    issued = true;
    return inner;
  });
  std::string message;
  try {
    work->wait(10s);  // a safety net (see below): a Watch that never fired fails, naming no queue
    ADD_FAILURE() << "a collective queued past its deadline succeeded";
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  EXPECT_NE(message.find("allreduce: timed out before it reached the communicator"), std::string::npos) << message;
  EXPECT_NE(message.find("behind the tasks of 'test lane' (running: slow algorithm)"), std::string::npos) << message;
  EXPECT_GE(took, 290ms) << "failed before its deadline";
  // A safety net: the task ahead never returns until released below, so without the deadline
  // the wait above would not return at all.
  EXPECT_LT(took, 10s) << "QueuedCollectiveFailsAtItsDeadlineAndStillIssuesInItsTurn: failed " << took.count()
                       << " ms after its issue (deadline 300 ms)";
  EXPECT_FALSE(issued.load()) << "issued before the task ahead of it returned";
  release.set_value();
  task->wait();
  lane.Submit("after", [] {}, false)->wait();  // the lane's queue has moved past the issue
  EXPECT_TRUE(issued.load()) << "a collective that timed out while queued was never issued";
  inner->Complete(nullptr);
  EXPECT_THROW(work->wait(), TimeoutError);  // the first outcome stays
}

// A deadline that the queue does not reach changes nothing.
TEST(OpLaneTest, QueuedCollectiveInTimeCompletesWithTheCollective) {
  OpLane lane("test");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  auto task = lane.Submit("algorithm", [gate] { gate.wait(); }, true);
  auto inner = std::make_shared<CompletionWork>("inner allreduce");
  auto work = lane.Issue("allreduce", std::chrono::steady_clock::now() + 60s, [&] { return inner; });
  release.set_value();
  task->wait();
  lane.Submit("after", [] {}, false)->wait();
  EXPECT_FALSE(work->is_completed());
  inner->Complete(nullptr);
  work->wait();
}

// Stop fails the caller's Work of a collective still queued (not only the lane's own task).
TEST(OpLaneTest, StopFailsAQueuedCollectivesWork) {
  OpLane lane("test");
  RunningTask running(lane);
  auto work = lane.Issue("allreduce", std::chrono::steady_clock::now() + 60s, [] {
    ADD_FAILURE() << "a queued collective was issued after Stop";
    return std::shared_ptr<Work>(std::make_shared<CompletionWork>("never"));
  });
  std::thread stopper([&] { lane.Stop("the process group was shut down"); });
  // Before the running task returns. Bounded (a safety net far above the expected
  // microseconds): a Stop that left the Work pending would otherwise hang here, as the
  // running task returns only once released below.
  try {
    work->wait(10s);
    ADD_FAILURE() << "StopFailsAQueuedCollectivesWork: the queued collective's Work succeeded";
  } catch (const AbortedError& e) {
    EXPECT_NE(std::string(e.what()).find("not issued, the process group was shut down"), std::string::npos)
        << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "StopFailsAQueuedCollectivesWork: Stop did not fail the queued collective's Work within 10 s "
                  << "(while the task ahead still runs): " << e.what();
  }
  running.Release();
  stopper.join();
  running.work().wait();
}

TEST(OpLaneTest, StopFailsQueuedTasksAndRefusesNewOnes) {
  OpLane lane("test");
  RunningTask running(lane);
  auto queued = lane.Submit("queued", [] { FAIL() << "a queued task ran after Stop"; }, true);
  std::thread stopper([&] { lane.Stop("the process group was shut down"); });
  std::this_thread::sleep_for(20ms);
  running.Release();
  stopper.join();
  running.work().wait();
  EXPECT_THROW(queued->wait(), AbortedError);
  EXPECT_THROW(lane.Submit("late", [] {}, false), AbortedError);
}

TEST(OpLaneTest, BlockingRunFromTheLaneItselfIsRefused) {
  OpLane lane("test");
  std::promise<std::string> message;
  lane.Submit("outer", [&] {
    try {
      lane.Run("inner", [] {}, true);
      message.set_value("no error");
    } catch (const InvalidArgumentError& e) {
      message.set_value(e.what());
    }
  }, true)->wait();
  EXPECT_NE(message.get_future().get().find("cannot run inside a callback"), std::string::npos);
  int ran = 0;
  lane.Run("from outside", [&] { ran = 1; }, true);
  EXPECT_EQ(ran, 1);
}

TEST(OpLaneTest, RunOnAnIdleLaneRunsOnTheCallerAndRethrows) {
  OpLane lane("test");
  std::thread::id ran_on;
  lane.Run("idle", [&] { ran_on = std::this_thread::get_id(); }, true);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_THROW(lane.Run("failing", [] { throw MismatchError("ranks disagree"); }, true), MismatchError);
  // The lane is free again: a later Run is inline too.
  lane.Run("again", [&] { ran_on = std::this_thread::get_id(); }, false);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(OpLaneTest, RunWaitsItsTurnBehindABusyLane) {
  OpLane lane("test");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::vector<int> order;
  auto first = lane.Submit("first", [&order, gate] {
    gate.wait();
    order.push_back(1);
  }, true);
  std::thread::id ran_on;
  std::thread caller([&] {
    lane.Run("second", [&] {
      order.push_back(2);
      ran_on = std::this_thread::get_id();
    }, true);
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(order.empty());
  release.set_value();
  caller.join();
  first->wait();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_NE(ran_on, caller.get_id());  // queued, so it ran on the lane's thread
}

TEST(OpLaneTest, AnInlineRunHoldsTheLane) {
  OpLane lane("test");
  std::promise<void> started, release;
  std::shared_future<void> gate = release.get_future().share();
  std::vector<std::string> order;
  std::mutex order_mu;
  auto note = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(order_mu);
    order.push_back(what);
  };
  std::thread runner([&] {
    lane.Run("inline", [&] {
      started.set_value();
      gate.wait();
      note("inline");
    }, /*uses_collectives=*/true);
  });
  started.get_future().wait();
  // While it runs: a queued task and a plain collective wait for it.
  auto queued = lane.Submit("queued", [&] { note("queued"); }, false);
  auto inner = std::make_shared<CompletionWork>("inner");
  bool issued = false;
  auto proxy = lane.Issue("allreduce", [&] {
    issued = true;
    note("issued");
    return inner;
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(issued);
  EXPECT_FALSE(queued->is_completed());
  release.set_value();
  runner.join();
  queued->wait();
  inner->Complete(nullptr);
  proxy->wait();
  EXPECT_TRUE(issued);
  EXPECT_EQ(order, (std::vector<std::string>{"inline", "queued", "issued"}));
}

TEST(OpLaneTest, BlockingRunInsideAnInlineRunIsRefused) {
  OpLane lane("test");
  std::string message = "no error";
  lane.Run("outer", [&] {
    try {
      lane.Run("inner", [] {}, true);
    } catch (const InvalidArgumentError& e) {
      message = e.what();
    }
  }, true);
  EXPECT_NE(message.find("cannot run inside a callback"), std::string::npos) << message;
}

TEST(OpLaneTest, StopWaitsForAnInlineRunAndRefusesLaterOnes) {
  OpLane lane("test");
  std::promise<void> started;
  std::atomic<bool> finished{false};
  std::thread runner([&] {
    lane.Run("inline", [&] {
      started.set_value();
      std::this_thread::sleep_for(50ms);
      finished = true;
    }, true);
  });
  started.get_future().wait();
  lane.Stop("test stop");
  EXPECT_TRUE(finished);
  runner.join();
  EXPECT_THROW(lane.Run("late", [] {}, true), AbortedError);
}

TEST(OpLaneTest, StopFromInsideAnInlineRunDoesNotWaitForItself) {
  // What happens when the last reference to a process group is dropped inside a blocking call
  // that runs inline: Stop must not wait for the task it is called from.
  OpLane lane("test");
  auto stopped = std::async(std::launch::async, [&] {
    lane.Run("inline", [&] { lane.Stop("stopped from inside"); }, true);
  });
  ASSERT_EQ(stopped.wait_for(5s), std::future_status::ready) << "Stop waited for the task it was called from";
  stopped.get();
  EXPECT_THROW(lane.Run("late", [] {}, true), AbortedError);
}

}  // namespace
}  // namespace gossipcc
