#include "torch_backend/process_group_gossipcc.h"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <string>
#include <utility>

#include "comm/core/errors.h"
#include "torch_backend/c10d_store.h"
#include "comm/sched/collective_issue.h"
#include "torch_backend/communicator_environment.h"
#include "torch_backend/gossipcc_work.h"
#include "torch_backend/tensor_buffer.h"

namespace gossipcc {
namespace torch_backend {
namespace {

using ::c10d::OpType;

[[noreturn]] void Unsupported(const std::string& what) {
  throw InvalidArgumentError("gossipcc backend does not support " + what);
}

void CheckRoot(int64_t root, int size, const char* op) {
  if (root < 0 || root >= size) {
    throw InvalidArgumentError(std::string("gossipcc ") + op + ": root rank " + std::to_string(root) +
                               " is out of range [0, " + std::to_string(size) + ")");
  }
}

}  // namespace

ProcessGroupGossipcc::ProcessGroupGossipcc(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                                           ProcessGroupOptions options)
    : C10dBackendBase(rank, size), options_(std::move(options)) {
  // The environment's settings, then the cross-rank check of those that must agree, within the
  // rendezvous's time; the communicator's rendezvous gets what is left of it.
  const auto started = std::chrono::steady_clock::now();
  const std::chrono::milliseconds budget = options_.communicator.rendezvous_timeout.count() > 0
                                               ? options_.communicator.rendezvous_timeout
                                               : options_.timeout;
  CommunicatorOptions communicator_options;
  std::string settings_error;
  try {
    communicator_options = CommunicatorOptionsFromEnvironment(options_.communicator, options_.timeout);
  } catch (const InvalidArgumentError& e) {
    settings_error = e.what();
  }
  std::shared_ptr<Store> rendezvous_store = WrapC10dStore(store);
  if (size > 1) {
    AgreeOnSharedSettings(*rendezvous_store, rank, size,
                          settings_error.empty() ? SharedSettings(communicator_options, options_.allreduce_policy,
                                                                  options_.allreduce_policy_source)
                                                 : std::vector<SharedSetting>{},
                          settings_error, budget);
  } else if (!settings_error.empty()) {
    throw InvalidArgumentError(settings_error);
  }
  communicator_options.rendezvous_timeout = std::max(
      budget - std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started),
      std::chrono::milliseconds(1));
  communicator_ = Communicator::Create(rendezvous_store, rank, size, std::move(communicator_options));
  executor_ = std::make_shared<CallbackExecutor>("gossipcc completions of rank " + std::to_string(rank));
  lane_ = std::make_unique<OpLane>("gossipcc algorithms");
  async_lane_ = std::make_unique<OpLane>("gossipcc asynchronous bilateral exchange");
  gossip_ = std::make_unique<GossipCollectives>(*communicator_, WrapC10dStore(store), *lane_, *async_lane_, executor_);
}

ProcessGroupGossipcc::~ProcessGroupGossipcc() { shutdown(); }

namespace {
BlockingRegionFactory& BlockingRegions() {
  static BlockingRegionFactory factory;
  return factory;
}
}  // namespace

void SetBlockingRegionFactory(BlockingRegionFactory factory) { BlockingRegions() = std::move(factory); }

void ProcessGroupGossipcc::shutdown() {
  std::shared_ptr<void> region = BlockingRegions() ? BlockingRegions()() : nullptr;
  // The communicator first: a lane task blocked in it fails at once, so the lanes stop promptly.
  if (communicator_) communicator_->shutdown();
  if (gossip_) gossip_->Shutdown();
  if (lane_) lane_->Stop("the process group was shut down");
  if (async_lane_) async_lane_->Stop("the process group was shut down");
  // Every operation has now completed (the failed ones with the shutdown's error): deliver
  // their completions, then stop the executor's threads, so that once shutdown returns
  // (destroy_process_group, interpreter exit) no thread of ours runs a callback.
  if (executor_) executor_->Stop(options_.timeout);
}

Completion ProcessGroupGossipcc::Ordered() const { return Completion{executor_, true}; }
Completion ProcessGroupGossipcc::Unordered() const { return Completion{executor_, false}; }

// In program order, within one timeout of the call: collective_issue.h.
std::shared_ptr<Work> ProcessGroupGossipcc::IssueCollective(const char* what, const at::Tensor& tensor,
                                                            gossipcc::IssueFn issue) {
  CollectiveIssue call;
  call.called = std::chrono::steady_clock::now();
  call.description = std::string("gossipcc ") + what + " on rank " + std::to_string(rank_);
  call.timeout = options_.timeout;
  call.stream = CallerStream(tensor);
  if (order_nested_ && !executor_->HoldsTurn()) call.ordering = executor_.get();
  return gossipcc::IssueCollective(call, *lane_, std::move(issue));
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::broadcast(std::vector<at::Tensor>& tensors,
                                                             const ::c10d::BroadcastOptions& opts) {
  CheckCallTimeout(opts.timeout, "broadcast", "BroadcastOptions");
  const StagedTensor s = Stage(SingleTensor(tensors, "broadcast", ""));
  const at::Tensor& t = s.data;
  CheckRoot(opts.rootRank, size_, "broadcast");
  if (opts.rootTensor != 0) Unsupported("broadcast with rootTensor != 0 (one tensor per rank)");
  auto work = IssueCollective("broadcast", t, [=](const CallOptions& call) { return communicator_->broadcast(ToBuffer(t, "broadcast", "tensor"), static_cast<int>(opts.rootRank), call); });
  return Wrap(rank_, Ordered(), OpType::BROADCAST, "gossipcc:broadcast", std::move(work), tensors, [s] { s.CopyBack(); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::allreduce(std::vector<at::Tensor>& tensors,
                                                             const ::c10d::AllreduceOptions& opts) {
  CheckCallTimeout(opts.timeout, "allreduce", "AllreduceOptions");
  const StagedTensor s = Stage(SingleTensor(tensors, "allreduce", ""));
  const at::Tensor& t = s.data;
  const ReduceOp op = ToReduceOp(opts.reduceOp, t, "allreduce");
  auto work = IssueCollective("allreduce", t, [=](const CallOptions& call) { return communicator_->allreduce(ToBuffer(t, "allreduce", "tensor"), op, call); });
  return Wrap(rank_, Ordered(), OpType::ALLREDUCE, "gossipcc:allreduce", std::move(work), tensors, [s] { s.CopyBack(); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  CheckCallTimeout(opts.timeout, "allreduce_coalesced", "AllreduceCoalescedOptions");
  if (tensors.empty()) throw InvalidArgumentError("gossipcc allreduce_coalesced: empty tensor list");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (t.scalar_type() != tensors[0].scalar_type() || t.device() != tensors[0].device()) {
      throw InvalidArgumentError("gossipcc allreduce_coalesced: tensor[" + std::to_string(i) + "] is " +
                                 c10::str(t.scalar_type(), " on ", t.device()) + ", tensor[0] is " +
                                 c10::str(tensors[0].scalar_type(), " on ", tensors[0].device()) +
                                 " (all must share dtype and device)");
    }
    ToBuffer(Stage(t).data, "allreduce_coalesced", "tensor[" + std::to_string(i) + "]");
  }
  const ReduceOp op = ToReduceOp(opts.reduceOp, tensors[0], "allreduce_coalesced");
  at::Tensor flat = Flatten(tensors);
  auto work = IssueCollective("allreduce", flat, [=](const CallOptions& call) { return communicator_->allreduce(ToBuffer(flat, "allreduce_coalesced", "flattened tensors"), op, call); });
  std::vector<at::Tensor> outputs = tensors;
  return Wrap(rank_, Ordered(), OpType::ALLREDUCE_COALESCED, "gossipcc:allreduce_coalesced", std::move(work), outputs,
              [flat, outputs]() mutable { Unflatten(flat, outputs); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::reduce(std::vector<at::Tensor>& tensors,
                                                          const ::c10d::ReduceOptions& opts) {
  CheckCallTimeout(opts.timeout, "reduce", "ReduceOptions");
  const StagedTensor s = Stage(SingleTensor(tensors, "reduce", ""));
  const at::Tensor& t = s.data;
  CheckRoot(opts.rootRank, size_, "reduce");
  if (opts.rootTensor != 0) Unsupported("reduce with rootTensor != 0 (one tensor per rank)");
  const ReduceOp op = ToReduceOp(opts.reduceOp, t, "reduce");
  // An all-reduce; ranks other than the root reduce into a scratch copy so their input is
  // left as it was (c10d leaves non-root tensors unspecified; we keep them intact).
  if (rank_ == opts.rootRank) {
    auto work = IssueCollective("allreduce", t, [=](const CallOptions& call) { return communicator_->allreduce(ToBuffer(t, "reduce", "tensor"), op, call); });
    return Wrap(rank_, Ordered(), OpType::REDUCE, "gossipcc:reduce", std::move(work), tensors, [s] { s.CopyBack(); });
  }
  at::Tensor scratch = t.clone();
  auto work = IssueCollective("allreduce", scratch, [=](const CallOptions& call) { return communicator_->allreduce(ToBuffer(scratch, "reduce", "tensor"), op, call); });
  return Wrap(rank_, Ordered(), OpType::REDUCE, "gossipcc:reduce", std::move(work), tensors, [scratch]() {});
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const ::c10d::AllgatherOptions& opts) {
  CheckCallTimeout(opts.timeout, "allgather", "AllgatherOptions");
  const at::Tensor input = Stage(SingleTensor(inputs, "allgather", "input")).data;
  if (outputs.size() != 1) {
    throw InvalidArgumentError("gossipcc allgather: expects one output list per rank, got " +
                               std::to_string(outputs.size()));
  }
  std::vector<at::Tensor>& out = outputs[0];
  if (static_cast<int>(out.size()) != size_) {
    throw InvalidArgumentError("gossipcc allgather: output list has " + std::to_string(out.size()) +
                               " tensors, expected world size " + std::to_string(size_));
  }
  CheckSameLayout(out, input, "allgather", "output");
  at::Tensor flat = at::empty({static_cast<int64_t>(size_) * input.numel()}, input.options());
  auto work = IssueCollective("allgather", input, [=](const CallOptions& call) { return communicator_->allgather(ToBuffer(input, "allgather", "input"), ToBuffer(flat, "allgather", "output"), call); });
  std::vector<at::Tensor> result = out;
  return Wrap(rank_, Ordered(), OpType::ALLGATHER, "gossipcc:allgather", std::move(work), result,
              [flat, result]() mutable { Unflatten(flat, result); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::_allgather_base(at::Tensor& user_output, at::Tensor& user_input,
                                                                   const ::c10d::AllgatherOptions& opts) {
  CheckCallTimeout(opts.timeout, "_allgather_base", "AllgatherOptions");
  const at::Tensor input = Stage(user_input).data;
  const StagedTensor out = Stage(user_output);
  const at::Tensor& output = out.data;
  if (output.scalar_type() != input.scalar_type() || output.device() != input.device() ||
      output.numel() != size_ * input.numel()) {
    throw InvalidArgumentError("gossipcc _allgather_base: output is " +
                               c10::str(output.numel(), " x ", output.scalar_type(), " on ", output.device()) +
                               ", expected world size x input = " +
                               c10::str(size_ * input.numel(), " x ", input.scalar_type(), " on ", input.device()));
  }
  auto work = IssueCollective("allgather", input, [=](const CallOptions& call) { return communicator_->allgather(ToBuffer(input, "_allgather_base", "input"),
                                       ToBuffer(output, "_allgather_base", "output"), call); });
  return Wrap(rank_, Ordered(), OpType::_ALLGATHER_BASE, "gossipcc:_allgather_base", std::move(work), {user_output},
              [out, input] { out.CopyBack(); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  CheckCallTimeout(opts.timeout, "allgather_coalesced", "AllgatherOptions");
  // Every rank contributes the same list of tensors; gathered as one flat allgather.
  if (inputs.empty()) throw InvalidArgumentError("gossipcc allgather_coalesced: empty input list");
  if (static_cast<int>(outputs.size()) != size_) {
    throw InvalidArgumentError("gossipcc allgather_coalesced: " + std::to_string(outputs.size()) +
                               " output lists, expected world size " + std::to_string(size_));
  }
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].size() != inputs.size()) {
      throw InvalidArgumentError("gossipcc allgather_coalesced: output list " + std::to_string(r) + " has " +
                                 std::to_string(outputs[r].size()) + " tensors, expected " +
                                 std::to_string(inputs.size()));
    }
    for (size_t i = 0; i < inputs.size(); ++i) CheckSameLayout({outputs[r][i]}, inputs[i], "allgather_coalesced", "output");
  }
  at::Tensor flat_in = Flatten(inputs);
  at::Tensor flat_out = at::empty({static_cast<int64_t>(size_) * flat_in.numel()}, flat_in.options());
  auto work = IssueCollective("allgather", flat_in, [=](const CallOptions& call) { return communicator_->allgather(ToBuffer(flat_in, "allgather_coalesced", "input"),
                                       ToBuffer(flat_out, "allgather_coalesced", "output"), call); });
  std::vector<at::Tensor> all;
  for (auto& list : outputs) all.insert(all.end(), list.begin(), list.end());
  return Wrap(rank_, Ordered(), OpType::ALLGATHER_COALESCED, "gossipcc:allgather_coalesced", std::move(work), all,
              [flat_in, flat_out, all]() mutable { Unflatten(flat_out, all); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const ::c10d::GatherOptions& opts) {
  CheckCallTimeout(opts.timeout, "gather", "GatherOptions");
  const at::Tensor input = Stage(SingleTensor(inputs, "gather", "input")).data;
  CheckRoot(opts.rootRank, size_, "gather");
  const int root = static_cast<int>(opts.rootRank);
  const size_t n = static_cast<size_t>(input.numel());
  // An all-to-all-v in which every rank sends its input to the root only: one message per
  // rank, ordered with the other collectives.
  std::vector<size_t> send_counts(size_, 0), recv_counts(size_, 0);
  send_counts[root] = n;
  at::Tensor flat;
  std::vector<at::Tensor> result;
  if (rank_ == root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_) {
      throw InvalidArgumentError("gossipcc gather: the root needs one output list of world size " +
                                 std::to_string(size_) + " tensors");
    }
    CheckSameLayout(outputs[0], input, "gather", "output");
    std::fill(recv_counts.begin(), recv_counts.end(), n);
    flat = at::empty({static_cast<int64_t>(size_ * n)}, input.options());
    result = outputs[0];
  } else {
    if (!outputs.empty() && !(outputs.size() == 1 && outputs[0].empty())) {
      throw InvalidArgumentError("gossipcc gather: non-root rank " + std::to_string(rank_) +
                                 " must pass no output tensors");
    }
    flat = at::empty({0}, input.options());
  }
  auto work = IssueCollective("alltoallv", input, [=](const CallOptions& call) { return communicator_->alltoallv(ToBuffer(input, "gather", "input"), send_counts,
                                       ToBuffer(flat, "gather", "output"), recv_counts, call); });
  return Wrap(rank_, Ordered(), OpType::GATHER, "gossipcc:gather", std::move(work), result,
              [flat, result, input]() mutable { Unflatten(flat, result); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const ::c10d::ScatterOptions& opts) {
  CheckCallTimeout(opts.timeout, "scatter", "ScatterOptions");
  const StagedTensor out = Stage(SingleTensor(outputs, "scatter", "output"));
  const at::Tensor& output = out.data;
  CheckRoot(opts.rootRank, size_, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  const size_t n = static_cast<size_t>(output.numel());
  std::vector<size_t> send_counts(size_, 0), recv_counts(size_, 0);
  recv_counts[root] = n;
  at::Tensor flat;
  if (rank_ == root) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
      throw InvalidArgumentError("gossipcc scatter: the root needs one input list of world size " +
                                 std::to_string(size_) + " tensors");
    }
    CheckSameLayout(inputs[0], output, "scatter", "input");
    std::fill(send_counts.begin(), send_counts.end(), n);
    flat = Flatten(inputs[0]);
  } else {
    if (!inputs.empty() && !(inputs.size() == 1 && inputs[0].empty())) {
      throw InvalidArgumentError("gossipcc scatter: non-root rank " + std::to_string(rank_) +
                                 " must pass no input tensors");
    }
    flat = at::empty({0}, output.options());
  }
  auto work = IssueCollective("alltoallv", flat, [=](const CallOptions& call) { return communicator_->alltoallv(ToBuffer(flat, "scatter", "input"), send_counts,
                                       ToBuffer(output, "scatter", "output"), recv_counts, call); });
  return Wrap(rank_, Ordered(), OpType::SCATTER, "gossipcc:scatter", std::move(work), outputs, [flat, out] { out.CopyBack(); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const ::c10d::ReduceScatterOptions& opts) {
  CheckCallTimeout(opts.timeout, "reduce_scatter", "ReduceScatterOptions");
  const StagedTensor out = Stage(SingleTensor(outputs, "reduce_scatter", "output"));
  const at::Tensor& output = out.data;
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
    throw InvalidArgumentError("gossipcc reduce_scatter: expects one input list of world size " +
                               std::to_string(size_) + " tensors");
  }
  CheckSameLayout(inputs[0], output, "reduce_scatter", "input");
  const ReduceOp op = ToReduceOp(opts.reduceOp, output, "reduce_scatter");
  at::Tensor flat = Flatten(inputs[0]);
  auto work = IssueCollective("reduce_scatter", flat, [=](const CallOptions& call) { return communicator_->reduce_scatter(ToBuffer(flat, "reduce_scatter", "input"),
                                            ToBuffer(output, "reduce_scatter", "output"), op, call); });
  return Wrap(rank_, Ordered(), OpType::REDUCE_SCATTER, "gossipcc:reduce_scatter", std::move(work), outputs,
              [flat, out] { out.CopyBack(); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::_reduce_scatter_base(at::Tensor& user_output, at::Tensor& user_input,
                                                                        const ::c10d::ReduceScatterOptions& opts) {
  CheckCallTimeout(opts.timeout, "_reduce_scatter_base", "ReduceScatterOptions");
  const at::Tensor input = Stage(user_input).data;
  const StagedTensor out = Stage(user_output);
  const at::Tensor& output = out.data;
  const ReduceOp op = ToReduceOp(opts.reduceOp, output, "_reduce_scatter_base");
  auto work = IssueCollective("reduce_scatter", input, [=](const CallOptions& call) { return communicator_->reduce_scatter(ToBuffer(input, "_reduce_scatter_base", "input"),
                                            ToBuffer(output, "_reduce_scatter_base", "output"), op, call); });
  return Wrap(rank_, Ordered(), OpType::_REDUCE_SCATTER_BASE, "gossipcc:_reduce_scatter_base", std::move(work),
              {user_output}, [out, input] { out.CopyBack(); });
}

namespace {

// Split sizes (in rows of dim 0) -> element counts; empty means equal splits.
std::vector<size_t> SplitCounts(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                const char* what) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row_elems = rows == 0 ? 0 : t.numel() / rows;
  std::vector<size_t> counts(size);
  if (splits.empty()) {
    if (rows % size != 0) {
      throw InvalidArgumentError(std::string("gossipcc alltoall_base: ") + what + " has " + std::to_string(rows) +
                                 " rows, not divisible by world size " + std::to_string(size));
    }
    std::fill(counts.begin(), counts.end(), static_cast<size_t>(rows / size * row_elems));
    return counts;
  }
  if (static_cast<int>(splits.size()) != size) {
    throw InvalidArgumentError(std::string("gossipcc alltoall_base: ") + what + " split sizes have " +
                               std::to_string(splits.size()) + " entries, expected world size " + std::to_string(size));
  }
  int64_t total = 0;
  for (int i = 0; i < size; ++i) {
    if (splits[i] < 0) throw InvalidArgumentError(std::string("gossipcc alltoall_base: negative ") + what + " split size");
    counts[i] = static_cast<size_t>(splits[i] * row_elems);
    total += splits[i];
  }
  if (total != rows) {
    throw InvalidArgumentError(std::string("gossipcc alltoall_base: ") + what + " split sizes sum to " +
                               std::to_string(total) + ", but the tensor has " + std::to_string(rows) + " rows");
  }
  return counts;
}

}  // namespace

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::alltoall_base(at::Tensor& user_output, at::Tensor& user_input,
                                                                 std::vector<int64_t>& output_split_sizes,
                                                                 std::vector<int64_t>& input_split_sizes,
                                                                 const ::c10d::AllToAllOptions& opts) {
  CheckCallTimeout(opts.timeout, "alltoall_base", "AllToAllOptions");
  const at::Tensor input = Stage(user_input).data;
  const StagedTensor out = Stage(user_output);
  const at::Tensor& output = out.data;
  std::vector<size_t> send = SplitCounts(input, input_split_sizes, size_, "input");
  std::vector<size_t> recv = SplitCounts(output, output_split_sizes, size_, "output");
  auto work = IssueCollective("alltoallv", input, [=](const CallOptions& call) { return communicator_->alltoallv(ToBuffer(input, "alltoall_base", "input"), send,
                                       ToBuffer(output, "alltoall_base", "output"), recv, call); });
  return Wrap(rank_, Ordered(), OpType::ALLTOALL_BASE, "gossipcc:alltoall_base", std::move(work), {user_output},
              [out, input] { out.CopyBack(); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const ::c10d::AllToAllOptions& opts) {
  CheckCallTimeout(opts.timeout, "alltoall", "AllToAllOptions");
  if (static_cast<int>(inputs.size()) != size_ || static_cast<int>(outputs.size()) != size_) {
    throw InvalidArgumentError("gossipcc alltoall: expects world size " + std::to_string(size_) +
                               " input and output tensors, got " + std::to_string(inputs.size()) + " and " +
                               std::to_string(outputs.size()));
  }
  std::vector<size_t> send(size_), recv(size_);
  for (int i = 0; i < size_; ++i) {
    if (inputs[i].scalar_type() != inputs[0].scalar_type() || outputs[i].scalar_type() != inputs[0].scalar_type() ||
        inputs[i].device() != inputs[0].device() || outputs[i].device() != inputs[0].device()) {
      throw InvalidArgumentError("gossipcc alltoall: every input and output tensor must share dtype and device");
    }
    send[i] = static_cast<size_t>(inputs[i].numel());
    recv[i] = static_cast<size_t>(outputs[i].numel());
  }
  at::Tensor flat_in = Flatten(inputs);
  at::Tensor flat_out = at::empty({std::accumulate(recv.begin(), recv.end(), int64_t{0})}, inputs[0].options());
  auto work = IssueCollective("alltoallv", flat_in, [=](const CallOptions& call) { return communicator_->alltoallv(ToBuffer(flat_in, "alltoall", "input"), send,
                                       ToBuffer(flat_out, "alltoall", "output"), recv, call); });
  std::vector<at::Tensor> result = outputs;
  return Wrap(rank_, Ordered(), OpType::ALLTOALL, "gossipcc:alltoall", std::move(work), result,
              [flat_in, flat_out, result]() mutable { Unflatten(flat_out, result); });
}

c10::intrusive_ptr<C10dWork> ProcessGroupGossipcc::barrier(const ::c10d::BarrierOptions& opts) {
  CheckCallTimeout(opts.timeout, "barrier", "BarrierOptions");
  return Wrap(rank_, Ordered(), OpType::BARRIER, "gossipcc:barrier", IssueCollective("barrier", at::Tensor(), [this](const CallOptions& call) { return communicator_->barrier(call); }), {});
}

void ProcessGroupGossipcc::CheckCallTimeout(std::chrono::milliseconds timeout, const char* op,
                                            const char* options) const {
  if (timeout == ::c10d::kUnsetTimeout || timeout == options_.timeout) return;
  throw InvalidArgumentError(c10::str(
      "gossipcc ", op, " on rank ", rank_, ": ", options, ".timeout = ", timeout.count(),
      " ms, but gossipcc's collectives take the process group's timeout (", options_.timeout.count(),
      " ms, init_process_group(timeout=...) or new_group(timeout=...)); leave ", options,
      ".timeout unset, or create the group with the timeout you want. work.wait(timeout) and "
      "monitored_barrier(timeout=...) take a timeout of their own"));
}

void ProcessGroupGossipcc::setSequenceNumberForGroup() { sequence_number_ = 0; }
uint64_t ProcessGroupGossipcc::getSequenceNumberForGroup() { return sequence_number_; }

}  // namespace torch_backend
}  // namespace gossipcc
