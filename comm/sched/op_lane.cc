#include "comm/sched/op_lane.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "comm/core/errors.h"

namespace gossipcc {

namespace {

// The communicator holds views, not owners: `issue` owns (by capture) every tensor the
// collective reads or writes, so it lives until the collective is done.
void KeepUntilDone(Work& work, std::function<std::shared_ptr<Work>()> issue) {
  work.add_done_callback([keep = std::move(issue)]() {});
}

}  // namespace

OpLane::~OpLane() { Stop("the lane " + name_ + " was destroyed"); }

std::shared_ptr<Work> OpLane::Submit(std::string description, std::function<void()> task, bool uses_collectives) {
  Task t;
  t.fn = std::move(task);
  t.uses_collectives = uses_collectives;
  t.work = std::make_shared<CompletionWork>(std::move(description));
  std::shared_ptr<Work> work = t.work;
  Enqueue(std::move(t));
  return work;
}

void OpLane::Enqueue(Task task) {
  const bool watched = task.caller_work && task.deadline != Clock::time_point::max();
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->stopped) throw AbortedError(task.work->description() + ": refused, " + s_->stop_reason);
    if (!thread_.joinable()) {
      thread_ = std::thread(&OpLane::Loop, s_);
      s_->thread_id = thread_.get_id();
    }
    if (watched && !watch_.joinable()) {
      watch_ = std::thread(&OpLane::Watch, s_, name_);
    }
    if (task.uses_collectives) ++s_->collective_tasks;
    s_->queue.push_back(std::move(task));
  }
  s_->cv.notify_one();
  if (watched) s_->watch_cv.notify_one();
}

std::shared_ptr<Work> OpLane::Issue(std::string description, Clock::time_point deadline,
                                    std::function<std::shared_ptr<Work>()> issue) {
  std::unique_lock<std::mutex> lock(s_->mu);
  if (s_->collective_tasks == 0 || s_->stopped) {
    // Issued under the lock: no collective task can be queued (and so issue) before it.
    // After Stop the communicator itself refuses the call with its own error.
    std::shared_ptr<Work> inner = issue();
    KeepUntilDone(*inner, std::move(issue));
    return inner;
  }
  auto proxy = std::make_shared<CompletionWork>(std::move(description));
  lock.unlock();
  // An issue-only task: it posts the collective (non-blocking) and lets it complete the proxy
  // (unless Watch failed the proxy at its deadline first: Complete keeps the first outcome).
  Task t;
  t.fn = [issue = std::move(issue), proxy]() mutable {
    std::shared_ptr<Work> inner;
    try {
      inner = issue();
    } catch (...) {
      proxy->Complete(std::current_exception());
      return;
    }
    Work* raw = inner.get();  // alive while its own callbacks run
    inner->add_done_callback([raw, proxy]() { proxy->Complete(raw->exception()); });
    KeepUntilDone(*inner, std::move(issue));
  };
  t.uses_collectives = true;
  t.work = std::make_shared<CompletionWork>(proxy->description() + " (issue)");
  t.caller_work = proxy;
  t.deadline = deadline;
  t.queued_at = Clock::now();
  Enqueue(std::move(t));
  return proxy;
}

// Watch fails a caller's Work on its own thread, and Work::Complete runs that Work's done
// callbacks there, inline (unlocked: `expired` is completed after the lock is dropped), as the
// lane's thread does for the Works its tasks complete. That cannot hold up Stop, which joins
// this thread: the only caller of Issue is the process group (collective_issue.cc), and the
// callbacks on the Works it returns only hand the completion to the group's CallbackExecutor
// (GossipccWork, gossipcc_work.h: Post / PostUnordered / PostNested queue it and return; the
// future's own, possibly blocking, callbacks run on the executor's threads). The executor runs
// a posted task inline only once it is stopped, which ProcessGroupGossipcc::shutdown does after
// stopping the lanes (so after this thread is joined). A callback that stops the lane from
// this thread is not joined (Stop detaches it); other callers (tests) must keep theirs as short.
void OpLane::Watch(std::shared_ptr<State> s, std::string name) {
  std::unique_lock<std::mutex> lock(s->mu);
  while (!s->stopped) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    std::vector<std::pair<std::shared_ptr<CompletionWork>, std::string>> expired;
    for (Task& t : s->queue) {
      if (!t.caller_work || t.deadline == Clock::time_point::max()) continue;
      if (t.deadline > now) {
        next = std::min(next, t.deadline);
        continue;
      }
      t.deadline = Clock::time_point::max();  // failed once; it still issues in its turn
      const auto queued = std::chrono::duration_cast<std::chrono::milliseconds>(now - t.queued_at).count();
      expired.emplace_back(
          t.caller_work,
          t.caller_work->description() + ": timed out before it reached the communicator: its deadline (the timeout " +
              "from its call) passed while it queued for " + std::to_string(queued) + " ms behind the tasks of '" +
              name + "'" + (s->running ? " (running: " + s->running_description + ")" : std::string()));
    }
    if (!expired.empty()) {
      lock.unlock();
      for (auto& [work, message] : expired) work->Complete(std::make_exception_ptr(TimeoutError(message)));
      lock.lock();
      continue;
    }
    if (next == Clock::time_point::max()) {
      s->watch_cv.wait(lock);
    } else {
      s->watch_cv.wait_until(lock, next);
    }
  }
}

void OpLane::Run(std::string description, std::function<void()> task, bool uses_collectives) {
  bool run_here = false;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    const auto me = std::this_thread::get_id();
    if ((thread_.joinable() && me == s_->thread_id) || (s_->running && me == s_->running_on)) {
      throw InvalidArgumentError(description + ": a blocking gossipcc call cannot run inside a callback of "
                                 "another gossipcc operation of the same process group (it would wait for itself)");
    }
    if (s_->stopped) throw AbortedError(description + ": refused, " + s_->stop_reason);
    if (s_->queue.empty() && !s_->running) {
      // Idle: run here, holding the lane as a queued task would: the lane's thread starts
      // nothing and plain collectives queue behind a collective task until it returns.
      run_here = true;
      s_->running = true;
      s_->running_on = me;
      s_->running_description = description;
      if (uses_collectives) ++s_->collective_tasks;
    }
  }
  if (!run_here) {
    Submit(std::move(description), std::move(task), uses_collectives)->wait();
    return;
  }
  if (std::exception_ptr error = RunHeld(*s_, task, uses_collectives)) std::rethrow_exception(error);
}

std::exception_ptr OpLane::RunHeld(State& s, std::function<void()>& fn, bool uses_collectives) {
  std::exception_ptr error;
  try {
    fn();
  } catch (...) {
    error = std::current_exception();
  }
  fn = nullptr;  // release captured tensors before completion callbacks run
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.running = false;
    if (uses_collectives) --s.collective_tasks;
  }
  s.cv.notify_all();  // the lane's thread (tasks queued meanwhile) and Stop()
  return error;
}

void OpLane::Stop(const std::string& reason) {
  std::deque<Task> dropped;
  std::thread thread, watch;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!s_->stopped) {
      s_->stopped = true;
      s_->stop_reason = reason;
    }
    dropped.swap(s_->queue);
    for (const Task& t : dropped) s_->collective_tasks -= t.uses_collectives ? 1 : 0;
    if (thread_.joinable()) {
      if (std::this_thread::get_id() != thread_.get_id()) {
        thread = std::move(thread_);
      } else {
        thread_.detach();  // stopped from a callback on the lane itself: it ends after this task
      }
    }
    if (watch_.joinable()) {
      if (std::this_thread::get_id() != watch_.get_id()) {
        watch = std::move(watch_);
      } else {
        watch_.detach();  // stopped from a callback of a Work it failed: it ends on its own
      }
    }
  }
  s_->cv.notify_all();
  s_->watch_cv.notify_all();
  for (Task& t : dropped) {
    t.work->Complete(std::make_exception_ptr(AbortedError(t.work->description() + ": not run, " + reason)));
    if (t.caller_work) {
      t.caller_work->Complete(
          std::make_exception_ptr(AbortedError(t.caller_work->description() + ": not issued, " + reason)));
    }
  }
  {
    // A task running inline on another thread: wait for it to return, like the lane's own
    // (which the join below waits for).
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->cv.wait(lock, [&] { return !s_->running || s_->running_on == std::this_thread::get_id() ||
                                   s_->running_on == s_->thread_id; });
  }
  if (thread.joinable()) thread.join();
  if (watch.joinable()) watch.join();
}

void OpLane::Loop(std::shared_ptr<State> s) {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      // A task Run() is running inline holds the lane: queued tasks wait for it.
      s->cv.wait(lock, [&] { return s->stopped || (!s->queue.empty() && !s->running); });
      if (s->queue.empty()) return;  // stopped
      task = std::move(s->queue.front());
      s->queue.pop_front();
      s->running = true;
      s->running_on = std::this_thread::get_id();
      s->running_description = task.work->description();
    }
    task.work->Complete(RunHeld(*s, task.fn, task.uses_collectives));
  }
}

}  // namespace gossipcc
