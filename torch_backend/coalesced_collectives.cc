// ProcessGroupGossipcc's coalesced forms of all_gather_into_tensor and reduce_scatter_tensor
// (torch 2.x: `_coalescing_manager`'s fast path, functional collectives' *_coalesced): each is
// one collective over a flat buffer holding every pair's data, not one collective per pair.
#include <string>
#include <utility>
#include <vector>

#include "comm/core/errors.h"
#include "torch_backend/gossipcc_work.h"
#include "torch_backend/process_group_gossipcc.h"
#include "torch_backend/tensor_buffer.h"

namespace gossipcc {
namespace torch_backend {

#if TORCH_VERSION_MAJOR >= 2
namespace {

// Pairs (outputs[i], inputs[i]) of one dtype and device, outputs[i] `ratio` times inputs[i]'s
// elements (ratio = world size for all-gather) or inputs[i] `ratio` times outputs[i]'s.
void CheckPairs(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, int ratio,
                bool output_is_larger, const char* op) {
  if (inputs.empty() || inputs.size() != outputs.size()) {
    throw InvalidArgumentError(std::string("gossipcc ") + op + ": expects as many outputs as inputs (at least one), got " +
                               std::to_string(outputs.size()) + " outputs and " + std::to_string(inputs.size()) +
                               " inputs");
  }
  const at::Tensor& first = inputs[0];
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& in = inputs[i];
    const at::Tensor& out = outputs[i];
    for (const at::Tensor* t : {&in, &out}) {
      if (!t->defined() || t->scalar_type() != first.scalar_type() || t->device() != first.device()) {
        throw InvalidArgumentError(std::string("gossipcc ") + op + ": pair " + std::to_string(i) + " has " +
                                   (t->defined() ? c10::str(t->scalar_type(), " on ", t->device()) : "an undefined tensor") +
                                   ", input 0 is " + c10::str(first.scalar_type(), " on ", first.device()) +
                                   " (every input and output must share dtype and device)");
      }
    }
    const int64_t small = output_is_larger ? in.numel() : out.numel();
    const int64_t large = output_is_larger ? out.numel() : in.numel();
    if (large != ratio * small) {
      throw InvalidArgumentError(std::string("gossipcc ") + op + ": pair " + std::to_string(i) + ": " +
                                 (output_is_larger ? "output" : "input") + " has " + std::to_string(large) +
                                 " elements, expected world size " + std::to_string(ratio) + " x " +
                                 std::to_string(small));
    }
    ToBuffer(Stage(in).data, op, "input[" + std::to_string(i) + "]");  // dtype and device supported
  }
}

}  // namespace

// One all-gather of every input back to back (N elements per rank); rank r's block of the flat
// result holds its inputs in order, so output i gets columns [offset_i, offset_i + n_i) of the
// (world size x N) result, row r being rank r's piece.
c10::intrusive_ptr<::c10d::Work> ProcessGroupGossipcc::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const ::c10d::AllgatherOptions& opts) {
  const char* op = "allgather_into_tensor_coalesced";
  CheckCallTimeout(opts.timeout, op, "AllgatherOptions");
  CheckPairs(outputs, inputs, size_, /*output_is_larger=*/true, op);
  at::Tensor flat_in = Flatten(inputs);
  const int64_t total = flat_in.numel();
  at::Tensor flat_out = at::empty({static_cast<int64_t>(size_) * total}, flat_in.options());
  auto work = IssueCollective("allgather", flat_in, [=](const CallOptions& call) {
    return communicator_->allgather(ToBuffer(flat_in, op, "flattened inputs"), ToBuffer(flat_out, op, "output"), call);
  });
  std::vector<at::Tensor> result = outputs;
  const int size = size_;
  return Wrap(rank_, Ordered(), ::c10d::OpType::COALESCED, "gossipcc:allgather_into_tensor_coalesced", std::move(work),
              result, [flat_in, flat_out, result, size, total]() mutable {
                const at::Tensor rows = flat_out.view({size, total});
                int64_t offset = 0;
                for (at::Tensor& out : result) {
                  const int64_t n = out.numel() / size;
                  out.copy_(rows.narrow(1, offset, n).reshape(out.sizes()));
                  offset += n;
                }
              });
}

// One reduce-scatter of a (world size x M) buffer whose row r holds every input's block r side
// by side (M = the outputs' elements together): rank r's reduced row is its outputs in order.
c10::intrusive_ptr<::c10d::Work> ProcessGroupGossipcc::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const ::c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  CheckCallTimeout(opts.timeout, op, "ReduceScatterOptions");
  CheckPairs(outputs, inputs, size_, /*output_is_larger=*/false, op);
  const ReduceOp reduce = ToReduceOp(opts.reduceOp, inputs[0], op);
  std::vector<at::Tensor> blocks;
  blocks.reserve(inputs.size());
  for (const at::Tensor& in : inputs) blocks.push_back(in.reshape({size_, in.numel() / size_}));
  at::Tensor flat_in = at::cat(blocks, 1).reshape({-1});
  at::Tensor flat_out = at::empty({flat_in.numel() / size_}, flat_in.options());
  auto work = IssueCollective("reduce_scatter", flat_in, [=](const CallOptions& call) {
    return communicator_->reduce_scatter(ToBuffer(flat_in, op, "rearranged inputs"), ToBuffer(flat_out, op, "output"),
                                         reduce, call);
  });
  std::vector<at::Tensor> result = outputs;
  return Wrap(rank_, Ordered(), ::c10d::OpType::COALESCED, "gossipcc:reduce_scatter_tensor_coalesced", std::move(work),
              result, [flat_in, flat_out, result]() mutable { Unflatten(flat_out, result); });
}
#endif

}  // namespace torch_backend
}  // namespace gossipcc
