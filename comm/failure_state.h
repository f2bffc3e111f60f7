// FailureState: whether a communicator is usable.
//
// A communicator is usable until its first transport failure (a timeout, a dead peer), which
// poisons it: the message streams between ranks are out of step after one, so every later call
// raises AbortedError quoting that first failure, as NCCL does after an abort. A mismatch does
// not poison (no data moved). Shutting down also makes it unusable, with its own reason.
// Thread-safe.
#pragma once

#include <exception>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/core/errors.h"

namespace gossipcc {

class FailureState {
 public:
  // Records `error` as the first failure, unless there is one already.
  void Poison(std::exception_ptr error) {
    absl::MutexLock lock(&mu_);
    if (first_failure_) return;
    first_failure_ = error;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      failure_text_ = e.what();
    }
  }

  // Marks the communicator shut down ("communicator shut down (<reason>)"), which is also the
  // first failure if there was none. False if it was shut down already.
  bool Stop(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    stopping_ = true;
    stop_reason_ = absl::StrCat("communicator shut down (", reason, ")");
    if (!first_failure_) first_failure_ = std::make_exception_ptr(AbortedError(stop_reason_));
    if (failure_text_.empty()) failure_text_ = stop_reason_;
    return true;
  }

  bool stopping() const {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }
  std::string stop_reason() const {
    absl::MutexLock lock(&mu_);
    return stop_reason_;
  }

  // For a new operation `what`: throws AbortedError("<what>: <why>") unless usable.
  void ThrowIfUnusable(const std::string& what) const {
    absl::MutexLock lock(&mu_);
    if (stopping_) throw AbortedError(absl::StrCat(what, ": ", stop_reason_));
    if (first_failure_) {
      throw AbortedError(absl::StrCat(what, ": communicator unusable after an earlier failure: ", failure_text_));
    }
  }

  // For a queued operation `what` about to start: its AbortedError if the communicator failed
  // (or shut down) meanwhile, else null.
  std::exception_ptr NotStarted(const std::string& what) const {
    absl::MutexLock lock(&mu_);
    if (!first_failure_) return nullptr;
    return std::make_exception_ptr(AbortedError(
        absl::StrCat(what, ": not started: communicator unusable after an earlier failure: ", failure_text_)));
  }

 private:
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  std::exception_ptr first_failure_ ABSL_GUARDED_BY(mu_);
  std::string failure_text_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gossipcc
