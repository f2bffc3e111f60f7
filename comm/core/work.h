// Work: the handle every asynchronous operation returns.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace gossipcc {

class Work {
 public:
  virtual ~Work() = default;

  // True once the operation has finished, successfully or not. Never blocks.
  virtual bool is_completed() = 0;

  // Blocks until the operation finishes and rethrows its error, if any. With a positive
  // `timeout`, throws TimeoutError if it is not done by then (the operation itself keeps
  // its own deadline, Communicator::Options::timeout). With none, waits for completion:
  // every operation is bounded by its own deadline, so this cannot hang forever.
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::zero()) = 0;

  // The error the operation finished with; nullptr while pending or on success.
  virtual std::exception_ptr exception() = 0;

  // Runs `fn` once the operation has finished (immediately, on this thread, if it already
  // has; otherwise on the thread that completes it). `fn` must not block.
  virtual void add_done_callback(std::function<void()> fn) = 0;

  // "allreduce #12 (1024 x float32 on cpu, sum) on rank 3 of 4"
  virtual const std::string& description() const = 0;
};

// A Work completed explicitly by whoever runs the operation (a worker thread).
class CompletionWork : public Work {
 public:
  explicit CompletionWork(std::string description) : description_(std::move(description)) {}

  bool is_completed() override;
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::zero()) override;
  std::exception_ptr exception() override;
  void add_done_callback(std::function<void()> fn) override;
  const std::string& description() const override { return description_; }

  // Marks the operation finished (error == nullptr: success) and runs the callbacks.
  void Complete(std::exception_ptr error);

  // Lets an untimed wait() run the operation on the waiting thread: `runner` starts it there
  // if it has not started yet (and its turn has come), else does nothing. This saves the two
  // thread hand-offs (to the worker and back) that dominate a small collective's latency.
  void SetInlineRunner(std::function<void()> runner);

 private:
  const std::string description_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::exception_ptr error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
  std::function<void()> inline_runner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gossipcc
