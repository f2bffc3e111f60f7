// Internal: the c10d Work every ProcessGroupGossipcc call returns, over a gossipcc::Work.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "comm/core/work.h"
#include "comm/sched/callback_executor.h"
#include "torch_backend/torch_version.h"

namespace gossipcc {
namespace torch_backend {

using C10dWork = ::c10d::Work;

inline std::vector<c10::Device> CudaDevicesOf(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.is_cuda() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}

// A c10d Work over a gossipcc Work. Its future completes with `outputs` once the gossipcc
// operation is done and `finish` (copying staged results into the caller's tensors) has run.
// Both happen on the process group's CallbackExecutor, never on the communicator's lane thread
// that completed the operation: the future's callbacks may block (PyTorch's powerSGD_hook waits
// for a nested all_reduce in one), and a lane thread they blocked could not start the nested
// collective. `ordered`: the completion runs in issue order with the group's other ordered
// operations (collectives and gossipcc's algorithms); point-to-point operations are unordered;
// an operation issued by a callback holding the executor's turn is nested (completes at once,
// while the callback keeps the turn: callback_executor.h).
class GossipccWork : public C10dWork {
 public:
  GossipccWork(int rank, ::c10d::OpType type, const char* title, std::shared_ptr<::gossipcc::Work> inner,
               std::vector<at::Tensor> outputs, std::function<void()> finish,
               std::shared_ptr<CallbackExecutor> executor, bool ordered)
      : C10dWork(rank, type, title),
        inner_(std::move(inner)),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         CudaDevicesOf(outputs_))),
        executor_(std::move(executor)),
        // Issued by a callback that holds the executor's turn: nested (callback_executor.h).
        nested_(ordered && executor_->HoldsTurn()),
        ordered_(ordered && !nested_),
        ticket_(ordered_ ? executor_->Reserve() : 0) {
    if (nested_) executor_->NestedIssued();
    // The callback holds what it needs, not this Work: a caller may drop the Work early.
    auto future = future_;
    auto inner_work = inner_;
    auto outputs_copy = outputs_;
    std::function<void()> complete = [future, inner_work, outputs_copy, finish = std::move(finish)]() mutable {
      std::exception_ptr error = inner_work->exception();
      if (!error) {
        try {
          if (finish) finish();
        } catch (...) {
          error = std::current_exception();
        }
      }
      finish = nullptr;  // releases staging tensors now
      if (error) {
        future->setError(error);
      } else {
        future->markCompleted(c10::IValue(c10::List<at::Tensor>(outputs_copy)));
      }
    };
    inner_->add_done_callback([executor = executor_, ordered = ordered_, nested = nested_, ticket = ticket_,
                               complete = std::move(complete)]() mutable {
      if (nested) {
        executor->PostNested(std::move(complete));
      } else if (ordered) {
        executor->Post(ticket, std::move(complete));
      } else {
        executor->PostUnordered(std::move(complete));
      }
    });
  }

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override {
    return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}

  bool wait(std::chrono::milliseconds timeout) override {
    // A callback waiting here for an operation it did not issue lets the next one start (that
    // operation's completion may need the turn); its own nested ones complete without it.
    if (!nested_) CallbackExecutor::YieldTurn();
    inner_->wait(timeout);          // throws TimeoutError / the operation's error
    // Done: run the completion here if its turn has come (no hand-off to an executor thread).
    if (ordered_) executor_->RunIfTurn(ticket_);
    future_->wait();  // `finish` has run
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Receives from any source: the sender's rank, written by the comm layer before completion.
  void set_source(std::shared_ptr<int> source) { source_ = std::move(source); }
  int sourceRank() const override {
    if (!source_) return C10dWork::sourceRank();  // throws: not a receive-from-any-source
    future_->wait();
    return *source_;
  }

 private:
  std::shared_ptr<int> source_;
  std::shared_ptr<::gossipcc::Work> inner_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<CallbackExecutor> executor_;
  const bool nested_;
  const bool ordered_;
  const uint64_t ticket_;
};

// Where a Work's completion runs: the group's executor, in issue order or not.
struct Completion {
  std::shared_ptr<CallbackExecutor> executor;
  bool ordered;
};

// `title` must outlive the Work (c10d keeps the pointer): a literal. `source`, if set, is the
// Work's sourceRank().
inline c10::intrusive_ptr<C10dWork> Wrap(int rank, const Completion& completion, ::c10d::OpType type, const char* title,
                                         std::shared_ptr<::gossipcc::Work> inner, std::vector<at::Tensor> outputs,
                                         std::function<void()> finish = nullptr, std::shared_ptr<int> source = nullptr) {
  auto work = c10::make_intrusive<GossipccWork>(rank, type, title, std::move(inner), std::move(outputs),
                                                std::move(finish), completion.executor, completion.ordered);
  if (source) work->set_source(std::move(source));
  return work;
}

}  // namespace torch_backend
}  // namespace gossipcc
