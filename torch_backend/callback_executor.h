// CallbackExecutor: runs the completions of a process group's operations (copying staged
// results back, completing the c10d Future, which runs its callbacks, Python ones included)
// off the communicator's lane threads, in the order the operations were issued.
//
// Why: a future's callbacks may block. PyTorch's own powerSGD_hook issues an all_reduce inside
// a callback and waits on it there. Run on the lane thread that completed the previous
// collective, such a callback would block the very thread the nested collective is queued on
// (collective k runs on lane k mod L): a deadlock that no timeout ends, since the nested
// collective never starts. Here a callback blocks only an executor thread, and threads are
// added while every existing one is busy, so a collective issued from a callback always starts.
//
// Guarantees:
//  - Ordered tasks (Reserve() a ticket when the operation is issued, Post() it when done) start
//    in ticket order, one at a time: a task holds the *turn* until it returns, so callbacks that
//    issue collectives issue them in the same order on every rank whatever order the
//    operations completed in on this one.
//  - Operations issued by a task that holds the turn are nested: their completions run at once,
//    outside the order, and the holder keeps the turn while it waits for them, so a callback that
//    issues a collective and waits for it (powerSGD_hook) runs to its end before the next one
//    starts, and every rank issues the same collectives in the same order.
//  - A task gives up the turn early when it waits for an operation that is not nested (its
//    completion may need the turn): the process group calls YieldTurn() then. A task that holds
//    the turn for `handoff_after` (1 s) with no nested operation pending while a later ordered task is
//    ready loses it anyway (a callback blocked on something the executor cannot see): the order
//    is kept where callbacks cooperate, and progress is guaranteed where they do not.
//  - Unordered tasks (point-to-point operations, whose completion order is the peers' affair)
//    start at once on a free thread.
//  - Stop() waits for every reserved ticket's task and every posted task to finish (bounded by
//    its `limit`), then joins the threads: after it returns no executor thread runs a callback.
//    Tasks posted after Stop() run on the posting thread, so no completion is ever lost.
// Torch-free.
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
namespace torch_backend {

class CallbackExecutor {
 public:
  struct Options {
    // How long a task may hold the turn, with no nested operation pending (counted from its
    // start or its last nested completion), while a later ordered task waits for it. A safety
    // net for callbacks blocked on what the executor cannot see; long enough for a callback's
    // own computation between its nested collectives.
    std::chrono::milliseconds handoff_after{1000};
    // An idle thread beyond the first exits after this long without work.
    std::chrono::milliseconds idle_exit_after{10000};
  };

  explicit CallbackExecutor(std::string name) : CallbackExecutor(std::move(name), Options{}) {}
  CallbackExecutor(std::string name, Options options);
  ~CallbackExecutor();  // Stop(1 minute)

  CallbackExecutor(const CallbackExecutor&) = delete;
  CallbackExecutor& operator=(const CallbackExecutor&) = delete;

  // A place in the order, taken when the operation is issued. Every ticket must be posted
  // exactly once (an operation that fails to issue posts an empty task).
  uint64_t Reserve();
  // Runs `task` in `ticket`'s turn.
  void Post(uint64_t ticket, std::function<void()> task);
  // Runs `task` as soon as a thread is free, outside the order.
  void PostUnordered(std::function<void()> task);

  // For a thread about to wait for `ticket`'s task: if it is posted and its turn has come,
  // runs it here (saving the hand-off to an executor thread and back) and returns true.
  bool RunIfTurn(uint64_t ticket);

  // Whether the calling thread runs an ordered task of this executor that holds the turn. An
  // operation issued there is *nested*: its completion is posted with PostNested, not ordered,
  // since the holder may wait for it (PyTorch's powerSGD_hook waits inside its callback for the
  // all_reduce it issued there). The holder keeps the turn meanwhile, so callbacks that issue
  // collectives and wait for them run one after another in ticket order: the same issue order
  // on every rank.
  bool HoldsTurn() const;
  // A nested operation was issued (HoldsTurn() was true): the turn is not taken away from its
  // holder while nested operations are pending (they end by their own deadlines).
  void NestedIssued();
  // Runs the completion of a nested operation at once, outside the order (NestedIssued() was
  // called for it).
  void PostNested(std::function<void()> task);

  // Waits until every ordered task whose ticket was reserved before this call has run to its
  // end (or the executor is stopped); false if `limit` passed first. For a process group that
  // orders nested collectives (ProcessGroupGossipcc::set_order_nested_collectives): a thread
  // that does not hold the turn issues its next collective only once the callbacks of the
  // earlier ones, and the collectives they issued, are done. Must not be called while holding
  // the turn (it would wait for itself).
  bool WaitForEarlierTasks(std::chrono::milliseconds limit);

  // Called by the process group when a thread waits for an operation that is not nested: if
  // the calling thread runs an ordered task of any executor that holds the turn, the next
  // ordered task may start now (the waited-for operation's completion may need the turn).
  // Cheap when it does not.
  static void YieldTurn();

  // Waits until every reserved ticket has been posted and run and every unordered task has
  // run, or `limit` has passed (then returns false and leaves the stragglers' threads to
  // finish on their own); joins the idle threads. Called from one of the executor's own tasks,
  // it waits for everything but that task. Idempotent; later posts run inline.
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

}  // namespace torch_backend
}  // namespace gossipcc
