#include "torch_backend/op_lane.h"

#include <utility>
#include <vector>

#include "comm/errors.h"

namespace gossipcc {
namespace torch_backend {

namespace {

// The communicator holds views, not owners: `issue` owns (by capture) every tensor the
// collective reads or writes, so it lives until the collective is done.
void KeepUntilDone(Work& work, std::function<std::shared_ptr<Work>()> issue) {
  work.add_done_callback([keep = std::move(issue)]() {});
}

}  // namespace

OpLane::~OpLane() { Stop("the process group was destroyed"); }

std::shared_ptr<Work> OpLane::Submit(std::string description, std::function<void()> task, bool uses_collectives) {
  auto work = std::make_shared<CompletionWork>(std::move(description));
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->stopped) throw AbortedError(work->description() + ": refused, " + s_->stop_reason);
    if (!thread_.joinable()) {
      thread_ = std::thread(&OpLane::Loop, s_);
      s_->thread_id = thread_.get_id();
    }
    if (uses_collectives) ++s_->collective_tasks;
    s_->queue.push_back(Task{std::move(task), uses_collectives, work});
  }
  s_->cv.notify_one();
  return work;
}

std::shared_ptr<Work> OpLane::Issue(std::string description, std::function<std::shared_ptr<Work>()> issue) {
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
  // An issue-only task: it posts the collective (non-blocking) and lets it complete the proxy.
  Submit(proxy->description() + " (issue)",
         [issue = std::move(issue), proxy]() mutable {
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
         },
         /*uses_collectives=*/true);
  return proxy;
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
  std::thread thread;
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
  }
  s_->cv.notify_all();
  for (Task& t : dropped) {
    t.work->Complete(std::make_exception_ptr(AbortedError(t.work->description() + ": not run, " + reason)));
  }
  {
    // A task running inline on another thread: wait for it to return, like the lane's own
    // (which the join below waits for).
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->cv.wait(lock, [&] { return !s_->running || s_->running_on == std::this_thread::get_id() ||
                                   s_->running_on == s_->thread_id; });
  }
  if (thread.joinable()) thread.join();
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
    }
    task.work->Complete(RunHeld(*s, task.fn, task.uses_collectives));
  }
}

}  // namespace torch_backend
}  // namespace gossipcc
