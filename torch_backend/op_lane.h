// OpLane: runs gossipcc's own (blocking) algorithm calls asynchronously, one at a time and in
// issue order, on a worker thread of the process group, and keeps the group's plain
// collectives in program order with them.
//
// Why: the algorithms (push-sum, PowerSGD, ...) are blocking calls that issue Communicator
// operations. Run on a thread of their own they would interleave their collectives with the
// plain collectives the caller keeps issuing, in an order that can differ between ranks. So:
//  - Submit() queues a task; tasks run strictly one after another, in submission order.
//  - Issue() is how the process group issues a plain collective: straight to the communicator
//    when no collective-issuing task is queued or running (the common case, no extra latency),
//    else queued behind them, so every rank issues its communicator collectives in program order.
//    A queued one still waiting at its deadline fails then (a watch thread, started with the
//    first such deadline), whatever the tasks ahead of it wait for.
// Point-to-point traffic (gossip rounds) uses its own tags and needs no such ordering.
// Torch-free.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/work.h"

namespace gossipcc {
namespace torch_backend {

class OpLane {
 public:
  explicit OpLane(std::string name) : name_(std::move(name)) {}
  ~OpLane();  // Stop()

  OpLane(const OpLane&) = delete;
  OpLane& operator=(const OpLane&) = delete;

  // Queues `task`; it runs on the lane's thread after every earlier task. The returned Work
  // completes (on that thread) with the task's exception, or success. `uses_collectives`: the
  // task issues Communicator collectives (plain collectives issued later wait for it).
  // Throws AbortedError after Stop().
  std::shared_ptr<Work> Submit(std::string description, std::function<void()> task, bool uses_collectives);

  // Issues a plain collective (`issue` calls the communicator and returns its Work): at once
  // when no collective-issuing task is queued or running, else queued behind them; the
  // returned Work completes with the collective. `issue` (and so whatever it captured, e.g.
  // the tensors behind the communicator's views) is kept until the collective completes.
  // Queued, the returned Work fails with TimeoutError at `deadline` if `issue` has not started
  // by then (naming the task it queued behind); `issue` still runs in its turn, so that every
  // rank's communicator sees the same collectives: the caller gives it the same deadline
  // (comm/issue_time.h), and the communicator then fails it at once, without touching its
  // buffers (which `issue` keeps alive meanwhile).
  std::shared_ptr<Work> Issue(std::string description, std::chrono::steady_clock::time_point deadline,
                              std::function<std::shared_ptr<Work>()> issue);
  std::shared_ptr<Work> Issue(std::string description, std::function<std::shared_ptr<Work>()> issue) {
    return Issue(std::move(description), std::chrono::steady_clock::time_point::max(), std::move(issue));
  }

  // Runs `task` in its turn and waits for it, rethrowing its error. When the lane is idle
  // (nothing queued or running) the task runs at once on the calling thread, with the lane
  // held for it exactly as for a queued task; otherwise it is queued and the caller waits.
  // (A blocking call that finds the lane idle, the usual case of a training step, then costs
  // no hand-off to the lane's thread and back.) Must not be called from a lane task (on the
  // lane's thread, e.g. from a future callback of a lane task, or from a task run inline):
  // InvalidArgumentError, since it would wait for itself.
  void Run(std::string description, std::function<void()> task, bool uses_collectives);

  // Refuses new tasks, fails queued ones with AbortedError (naming `reason`) and waits for the
  // running one (queued or inline) to return. Idempotent.
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
  // Shared with the worker thread, so that a lane stopped from its own thread (the last
  // reference to the process group dropped inside a completion callback) can let the thread
  // finish on its own after the OpLane is gone.
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

}  // namespace torch_backend
}  // namespace gossipcc
