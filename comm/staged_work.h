// StagedWork: a CUDA collective's Work, in two stages: first the CPU stage (the signature
// check, then the NCCL launch, on the collective's lane), then the launched operation's own
// completion. It is done when both are; a failed first stage is its error.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "comm/core/work.h"

namespace gossipcc {

class StagedWork final : public Work {
 public:
  explicit StagedWork(std::string description) : stage_(description), description_(std::move(description)) {}

  void SetLaunched(std::shared_ptr<Work> launched) {
    {
      absl::MutexLock lock(&mu_);
      launched_ = std::move(launched);
    }
    stage_.Complete(nullptr);
  }
  void Fail(std::exception_ptr error) { stage_.Complete(std::move(error)); }

  bool is_completed() override {
    if (!stage_.is_completed()) return false;
    auto launched = Launched();
    return launched == nullptr || launched->is_completed();
  }
  void wait(std::chrono::milliseconds timeout) override {
    const auto start = std::chrono::steady_clock::now();
    stage_.wait(timeout);
    auto launched = Launched();
    if (launched == nullptr) return;
    auto left = timeout;
    if (timeout.count() > 0) {
      left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (left.count() <= 0) left = std::chrono::milliseconds(1);
    }
    launched->wait(left);
  }
  std::exception_ptr exception() override {
    if (auto e = stage_.exception()) return e;
    auto launched = Launched();
    return launched ? launched->exception() : nullptr;
  }
  void add_done_callback(std::function<void()> fn) override {
    stage_.add_done_callback([this, fn = std::move(fn)]() mutable {
      auto launched = Launched();
      if (launched) {
        launched->add_done_callback(std::move(fn));
      } else {
        fn();
      }
    });
  }
  const std::string& description() const override { return description_; }

 private:
  std::shared_ptr<Work> Launched() {
    absl::MutexLock lock(&mu_);
    return launched_;
  }
  CompletionWork stage_;
  const std::string description_;
  absl::Mutex mu_;
  std::shared_ptr<Work> launched_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gossipcc
