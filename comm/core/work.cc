#include "comm/core/work.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "comm/core/errors.h"

namespace gossipcc {

bool CompletionWork::is_completed() {
  absl::MutexLock lock(&mu_);
  return done_;
}

void CompletionWork::SetInlineRunner(std::function<void()> runner) {
  absl::MutexLock lock(&mu_);
  inline_runner_ = std::move(runner);
}

void CompletionWork::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    // Only an untimed wait may run the operation itself: a timed one must be able to return
    // while the operation is still running.
    std::function<void()> runner;
    {
      absl::MutexLock lock(&mu_);
      if (!done_) runner = inline_runner_;
    }
    if (runner) runner();
  }
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done_; };
  if (timeout.count() > 0) {
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(timeout.count()))) {
      throw TimeoutError(absl::StrCat(description_, ": wait timed out after ", timeout.count(),
                                      " ms (the operation is still running)"));
    }
  } else {
    mu_.Await(absl::Condition(&done));
  }
  if (error_) std::rethrow_exception(error_);
}

std::exception_ptr CompletionWork::exception() {
  absl::MutexLock lock(&mu_);
  return error_;
}

void CompletionWork::add_done_callback(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
  }
  fn();
}

void CompletionWork::Complete(std::exception_ptr error) {
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    error_ = std::move(error);
    inline_runner_ = nullptr;
    callbacks.swap(callbacks_);
  }
  for (auto& fn : callbacks) fn();
}

}  // namespace gossipcc
