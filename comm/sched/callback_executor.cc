#include "comm/sched/callback_executor.h"

#include <cstdio>
#include <exception>
#include <utility>
#include <vector>

namespace gossipcc {

namespace {

// The tasks this thread is running (nested when a task waits for an operation whose
// completion it then runs itself, RunIfTurn), innermost last.
struct Running {
  std::shared_ptr<void> state;  // keeps the executor's state alive while a task runs
  void* key;
  bool ordered;
  uint64_t ticket;
};
thread_local std::vector<Running> tl_running;

}  // namespace

CallbackExecutor::CallbackExecutor(std::string name, Options options)
    : s_(std::make_shared<State>(std::move(name), options)) {}

CallbackExecutor::~CallbackExecutor() { Stop(std::chrono::minutes(1)); }

uint64_t CallbackExecutor::Reserve() {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->next_ticket++;
}

bool CallbackExecutor::HasOrderedWork(const State& s) {
  auto it = s.ordered.find(s.next_turn);
  return it != s.ordered.end();
}

void CallbackExecutor::MaybeSpawn(const std::shared_ptr<State>& s) {
  if (s->closed) return;
  if (s->unordered.empty() && !HasOrderedWork(*s)) return;
  if (s->idle > 0) {
    s->cv.notify_one();
    return;
  }
  // Reap threads that left on their own (idle too long).
  for (auto it = s->workers.begin(); it != s->workers.end();) {
    if (it->finished) {
      it->thread.join();
      it = s->workers.erase(it);
    } else {
      ++it;
    }
  }
  s->workers.emplace_back();
  Worker* w = &s->workers.back();
  ++s->started;
  w->thread = std::thread(&CallbackExecutor::Loop, s, w);
}

void CallbackExecutor::Post(uint64_t ticket, std::function<void()> task) {
  std::unique_lock<std::mutex> lock(s_->mu);
  if (s_->closed) {
    lock.unlock();
    RunTask(*s_, task);
    return;
  }
  s_->ordered.emplace(ticket, std::move(task));
  MaybeSpawn(s_);
}

void CallbackExecutor::PostUnordered(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(s_->mu);
  if (s_->closed) {
    lock.unlock();
    RunTask(*s_, task);
    return;
  }
  s_->unordered.push_back(std::move(task));
  MaybeSpawn(s_);
}

void CallbackExecutor::RunTask(State& s, std::function<void()>& task) {
  try {
    task();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gossipcc: %s: a completion callback threw: %s\n", s.name.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "gossipcc: %s: a completion callback threw a non-standard exception\n", s.name.c_str());
  }
  task = nullptr;  // captures (tensors) released here, without the executor's lock
}

void CallbackExecutor::RunOrdered(State& s, std::unique_lock<std::mutex>& lock, uint64_t ticket) {
  auto it = s.ordered.find(ticket);
  std::function<void()> task = std::move(it->second);
  s.ordered.erase(it);
  s.next_turn = ticket + 1;
  s.turn_held = true;
  s.turn_ticket = ticket;
  s.turn_since = std::chrono::steady_clock::now();
  ++s.running;
  s.active_ordered.insert(ticket);
  lock.unlock();
  RunTask(s, task);
  lock.lock();
  if (s.turn_held && s.turn_ticket == ticket) s.turn_held = false;
  s.active_ordered.erase(ticket);
  --s.running;
  s.done_cv.notify_all();
}

bool CallbackExecutor::RunIfTurn(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(s_->mu);
  if (s_->closed || s_->turn_held || s_->next_turn != ticket || s_->ordered.count(ticket) == 0) return false;
  tl_running.push_back(Running{s_, s_.get(), true, ticket});
  RunOrdered(*s_, lock, ticket);
  tl_running.pop_back();
  MaybeSpawn(s_);  // the next ordered task may be ready
  return true;
}

bool CallbackExecutor::WaitForEarlierTasks(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(s_->mu);
  const uint64_t reserved = s_->next_ticket;
  return s_->done_cv.wait_for(lock, limit, [&] {
    if (s_->closed) return true;
    if (s_->next_turn < reserved) return false;
    return s_->active_ordered.empty() || *s_->active_ordered.begin() >= reserved;
  });
}

bool CallbackExecutor::HoldsTurn() const {
  for (const Running& r : tl_running) {
    if (r.key != s_.get() || !r.ordered) continue;
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->turn_held && s_->turn_ticket == r.ticket) return true;
  }
  return false;
}

void CallbackExecutor::NestedIssued() {
  std::lock_guard<std::mutex> lock(s_->mu);
  ++s_->nested_pending;
}

void CallbackExecutor::PostNested(std::function<void()> task) {
  PostUnordered([s = s_, task = std::move(task)]() mutable {
    RunTask(*s, task);
    std::lock_guard<std::mutex> lock(s->mu);
    --s->nested_pending;
    // The holder, which may have been waiting for this, gets handoff_after anew to go on
    // (issue its next nested operation, or return) before a watcher may take the turn away.
    s->turn_since = std::chrono::steady_clock::now();
    s->cv.notify_all();
  });
}

void CallbackExecutor::YieldTurn() {
  for (Running& r : tl_running) {
    if (!r.ordered) continue;
    auto* s = static_cast<State*>(r.key);
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->turn_held && s->turn_ticket == r.ticket) {
      s->turn_held = false;
      MaybeSpawn(std::static_pointer_cast<State>(r.state));
    }
  }
}

void CallbackExecutor::Loop(std::shared_ptr<State> s, Worker* self) {
  std::unique_lock<std::mutex> lock(s->mu);
  auto idle_since = std::chrono::steady_clock::now();
  for (;;) {
    if (!s->unordered.empty()) {
      std::function<void()> task = std::move(s->unordered.front());
      s->unordered.pop_front();
      ++s->running;
      tl_running.push_back(Running{s, s.get(), false, 0});
      lock.unlock();
      RunTask(*s, task);
      lock.lock();
      tl_running.pop_back();
      --s->running;
      s->done_cv.notify_all();
      idle_since = std::chrono::steady_clock::now();
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (HasOrderedWork(*s)) {
      if (!s->turn_held) {
        const uint64_t ticket = s->next_turn;
        tl_running.push_back(Running{s, s.get(), true, ticket});
        RunOrdered(*s, lock, ticket);
        tl_running.pop_back();
        idle_since = std::chrono::steady_clock::now();
        continue;
      }
      // The turn is held while the next task waits: take it away once it has been held
      // for handoff_after with no nested operation pending (the holder is blocked on
      // something we cannot see). Nested operations end by their own deadlines.
      const auto deadline = s->turn_since + s->options.handoff_after;
      if (now >= deadline && s->nested_pending == 0) {
        s->turn_held = false;
        continue;
      }
      ++s->idle;
      if (now >= deadline) {
        s->cv.wait(lock);  // until a nested completion (or anything else) changes the state
      } else {
        s->cv.wait_until(lock, deadline);
      }
      --s->idle;
      continue;
    }
    if (s->closed) break;
    if (s->workers.size() > 1 && now - idle_since >= s->options.idle_exit_after) break;
    ++s->idle;
    s->cv.wait_until(lock, idle_since + s->options.idle_exit_after);
    --s->idle;
  }
  self->finished = true;
}

bool CallbackExecutor::Stop(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(s_->mu);
  if (s_->closing) return true;
  s_->closing = true;
  // Tasks of this executor running on this very thread (Stop called from a callback).
  int mine = 0;
  for (const Running& r : tl_running) mine += r.key == s_.get() ? 1 : 0;
  const bool drained = s_->done_cv.wait_for(lock, limit, [&] {
    return s_->ordered.empty() && s_->unordered.empty() && s_->next_turn == s_->next_ticket &&
           s_->running == mine;
  });
  s_->closed = true;
  s_->cv.notify_all();
  s_->done_cv.notify_all();  // WaitForEarlierTasks
  lock.unlock();
  // No thread is added after `closed`, so the list is fixed; each thread writes only its own
  // node's `finished` (under the lock), never the thread handle used here.
  const auto me = std::this_thread::get_id();
  for (Worker& w : s_->workers) {
    if (w.thread.get_id() == me || !drained) {
      // This thread, or one stuck in a task past the limit: it finishes on its own (it holds
      // the state alive) and touches nothing of the caller's.
      w.thread.detach();
    } else {
      w.thread.join();
    }
  }
  if (!drained) {
    std::fprintf(stderr, "gossipcc: %s: completion callbacks still running %lld ms after shutdown began; not waiting\n",
                 s_->name.c_str(), static_cast<long long>(limit.count()));
  }
  return drained;
}

int CallbackExecutor::threads_started() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->started;
}

}  // namespace gossipcc
