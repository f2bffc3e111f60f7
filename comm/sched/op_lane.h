// OpLane: runs blocking algorithm calls on a communicator (push-sum, PowerSGD, ...) one at a
// time, in issue order, off the caller's thread (Submit returns a Work: asynchronous algorithms
// for C++ users too), and keeps plain collectives in program order with them: a plain collective
// goes straight to the communicator unless a task that issues collectives is queued or running,
// else it queues behind it, so every rank issues its communicator collectives in the same order.
// The c10d backend keeps one per process group.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/core/work.h"

namespace gossipcc {

class OpLane {
 public:
  explicit OpLane(std::string name) : name_(std::move(name)) {}
  ~OpLane();  // Stop()

  OpLane(const OpLane&) = delete;
  OpLane& operator=(const OpLane&) = delete;

  // Queues `task` after every earlier one; its Work completes with the task's outcome.
  // `uses_collectives`: later plain collectives wait for it. AbortedError after Stop().
  std::shared_ptr<Work> Submit(std::string description, std::function<void()> task, bool uses_collectives);

  // Issues a plain collective, at once or queued behind collective-issuing tasks; `issue` is
  // kept until it completes. Queued past `deadline`, the Work fails (TimeoutError naming the
  // task ahead), and `issue` still runs in its turn so every rank sees the same collectives.
  std::shared_ptr<Work> Issue(std::string description, std::chrono::steady_clock::time_point deadline,
                              std::function<std::shared_ptr<Work>()> issue);
  std::shared_ptr<Work> Issue(std::string description, std::function<std::shared_ptr<Work>()> issue) {
    return Issue(std::move(description), std::chrono::steady_clock::time_point::max(), std::move(issue));
  }

  // Runs `task` in its turn and waits, rethrowing its error; on an idle lane on this thread,
  // holding the lane. From a lane task: InvalidArgumentError (it would wait for itself).
  void Run(std::string description, std::function<void()> task, bool uses_collectives);

  // Fails queued tasks (AbortedError naming `reason`), waits for the running one. Idempotent.
  void Stop(const std::string& reason);

 private:
  using Clock = std::chrono::steady_clock;
  struct Task {
    std::function<void()> fn;
    bool uses_collectives = false;
    std::shared_ptr<CompletionWork> work;
    // Issue's queued collective: the caller's Work, failed at `deadline` while still queued
    // (and at Stop).
    std::shared_ptr<CompletionWork> caller_work;
    Clock::time_point deadline = Clock::time_point::max();
    Clock::time_point queued_at;
  };
  // Shared with the worker thread, which may outlive a lane stopped from that thread.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> queue;
    int collective_tasks = 0;  // queued or running tasks that issue collectives
    bool stopped = false;
    std::string stop_reason;
    std::thread::id thread_id;
    // A task holds the lane: on the lane's thread, or inline on a Run() caller's thread.
    bool running = false;
    std::thread::id running_on;
    std::string running_description;  // of the task holding the lane
    std::condition_variable watch_cv;  // for Watch(): a new deadline, or Stop
  };
  static void Loop(std::shared_ptr<State> state);
  // Fails queued collectives whose deadline has passed (their caller_work), until Stop.
  static void Watch(std::shared_ptr<State> state, std::string name);
  void Enqueue(Task task);
  // Runs `fn`, which the caller made hold the lane (running, running_on, collective_tasks
  // counted); then releases the lane and returns fn's exception, if any.
  static std::exception_ptr RunHeld(State& s, std::function<void()>& fn, bool uses_collectives);

  const std::string name_;
  std::shared_ptr<State> s_ = std::make_shared<State>();
  std::thread thread_;  // started by the first Submit
  std::thread watch_;   // Watch(), started by the first Issue queued with a deadline
};

}  // namespace gossipcc
