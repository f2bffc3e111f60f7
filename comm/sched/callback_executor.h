// CallbackExecutor: runs a process group's completions (staged results copied back, the c10d
// Future completed, its callbacks run) off the communicator's lane threads, so that a callback
// that issues a collective and waits for it (PyTorch's powerSGD_hook) never blocks the thread
// that collective needs (docs/architecture.md). Guarantees:
//  - Ordered tasks (Reserve() at issue, Post() when done) start in ticket order, one at a time,
//    each holding the turn until it returns; operations a holder issues are nested (completed at
//    once, outside the order) and it keeps the turn while waiting for them, so callbacks issue
//    their collectives in the same order on every rank.
//  - A holder gives the turn up when it waits for a non-nested operation (YieldTurn), or after
//    `handoff_after` without a nested operation pending while a later task is ready.
//  - Unordered tasks (point-to-point completions) start at once; threads are added while every
//    thread is busy, so a nested collective always starts.
//  - After Stop() no executor thread runs a callback; later posts run on the posting thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace gossipcc {

class CallbackExecutor {
 public:
  struct Options {
    // How long a task may hold the turn with no nested operation pending while a later ordered
    // task waits (a safety net for callbacks blocked on what the executor cannot see).
    std::chrono::milliseconds handoff_after{1000};
    // An idle thread beyond the first exits after this long without work.
    std::chrono::milliseconds idle_exit_after{10000};
  };

  explicit CallbackExecutor(std::string name) : CallbackExecutor(std::move(name), Options{}) {}
  CallbackExecutor(std::string name, Options options);
  ~CallbackExecutor();  // Stop(1 minute)

  CallbackExecutor(const CallbackExecutor&) = delete;
  CallbackExecutor& operator=(const CallbackExecutor&) = delete;

  // A place in the order, taken at issue; every ticket is posted exactly once.
  uint64_t Reserve();
  // Runs `task` in `ticket`'s turn.
  void Post(uint64_t ticket, std::function<void()> task);
  // Runs `task` as soon as a thread is free, outside the order.
  void PostUnordered(std::function<void()> task);

  // Runs `ticket`'s task on this (waiting) thread if it is posted and its turn has come.
  bool RunIfTurn(uint64_t ticket);

  // Whether the calling thread runs the ordered task that holds the turn: what it issues is
  // nested (NestedIssued, then PostNested for its completion).
  bool HoldsTurn() const;
  // The holder keeps the turn while nested operations are pending.
  void NestedIssued();
  // A nested operation's completion: run at once, outside the order.
  void PostNested(std::function<void()> task);

  // Waits until every ordered task reserved before this call has ended (or Stop); false if
  // `limit` passed first. For order_nested_collectives; never while holding the turn.
  bool WaitForEarlierTasks(std::chrono::milliseconds limit);

  // Before a wait for a non-nested operation: a turn this thread holds passes to the next task.
  static void YieldTurn();

  // Waits for every reserved and posted task (false if `limit` passed first), joins the idle
  // threads; from a task of its own, for everything but that task. Idempotent.
  bool Stop(std::chrono::milliseconds limit);

  // Threads started so far (for tests).
  int threads_started() const;

 private:
  struct Worker {
    std::thread thread;
    bool finished = false;
  };
  struct State {
    const std::string name;
    const Options options;
    mutable std::mutex mu;
    std::condition_variable cv;       // work for the threads
    std::condition_variable done_cv;  // Stop(): progress
    uint64_t next_ticket = 0;         // next Reserve()
    uint64_t next_turn = 0;           // lowest ticket not yet started
    std::map<uint64_t, std::function<void()>> ordered;
    std::set<uint64_t> active_ordered;  // tickets whose task is running
    std::deque<std::function<void()>> unordered;
    bool turn_held = false;
    uint64_t turn_ticket = 0;
    std::chrono::steady_clock::time_point turn_since;
    int nested_pending = 0;  // nested operations of the turn's holder not yet completed
    int running = 0;  // tasks running (on executor threads or inline)
    int idle = 0;     // threads waiting for work
    bool closing = false;  // Stop() began
    bool closed = false;   // Stop() drained (or gave up): threads exit, posts run inline
    std::list<Worker> workers;  // nodes never move; a thread's own node outlives it
    int started = 0;
    State(std::string n, Options o) : name(std::move(n)), options(o) {}
  };

  static void Loop(std::shared_ptr<State> s, Worker* self);
  // Starts a thread if work is waiting and no thread is idle. Called with s.mu held.
  static void MaybeSpawn(const std::shared_ptr<State>& s);
  // Runs an ordered task holding the turn; called with `lock` held, returns with it held.
  static void RunOrdered(State& s, std::unique_lock<std::mutex>& lock, uint64_t ticket);
  static void RunTask(State& s, std::function<void()>& task);
  static bool HasOrderedWork(const State& s);

  std::shared_ptr<State> s_;
};

}  // namespace gossipcc
