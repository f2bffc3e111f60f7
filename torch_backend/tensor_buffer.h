// Tensor -> Buffer views and c10d arguments -> comm's, with the checks every c10d call makes;
// each error is an InvalidArgumentError naming `op` and the tensor.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "comm/core/types.h"

namespace gossipcc {
namespace torch_backend {

// The dtype `type` travels as (bool as uint8); complex and quantized ones are refused.
DType ToDType(at::ScalarType type, const char* op);
Device ToDevice(const at::Device& device, const char* op);

// A view of a dense, contiguous CPU or CUDA tensor; `what`: "input", "output[2]", ...
Buffer ToBuffer(const at::Tensor& tensor, const char* op, const std::string& what);

// c10d's ReduceOp -> comm's, for `tensor`'s dtype; `where` names the call in errors.
ReduceOp ToReduceOp(const ::c10d::ReduceOp& op, const at::Tensor& tensor, const char* where);

// One flat contiguous tensor holding `tensors` (any strides) back to back, all of one dtype.
at::Tensor Flatten(const std::vector<at::Tensor>& tensors);
// Copies consecutive pieces of `flat` into `tensors` (any strides).
void Unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors);

// A non-contiguous tensor travels through a contiguous copy, as torch's Gloo backend accepts
// any dense strided tensor: `data` is `user` itself when contiguous, else a contiguous copy of
// it; CopyBack() writes `data` into `user` (for tensors the operation writes) when they differ.
struct StagedTensor {
  at::Tensor user, data;
  bool copied() const { return !data.is_same(user); }
  void CopyBack() const {
    if (copied()) user.copy_(data);
  }
};
StagedTensor Stage(const at::Tensor& tensor);

// The one tensor of `tensors` (one per rank and call, as ProcessGroupGloo on one device).
const at::Tensor& SingleTensor(const std::vector<at::Tensor>& tensors, const char* op, const char* what);

// Checks that every tensor in `tensors` has `reference`'s dtype, device and element count.
void CheckSameLayout(const std::vector<at::Tensor>& tensors, const at::Tensor& reference, const char* op,
                     const char* what);

// The algorithms' tensors: non-empty, contiguous, one float dtype, one device (CPU if `cpu_only`).
std::vector<Buffer> FloatingBuffers(const std::vector<at::Tensor>& tensors, const char* op, bool cpu_only = false);

// The caller's current CUDA stream on `tensor`'s device (for CallOptions::cuda_stream); null for CPU.
void* CallerStream(const at::Tensor& tensor);

// Blocks until the caller's current stream on each CUDA device of `tensors` is idle: for
// operations that read or write the tensors from another thread (no-op for CPU tensors).
void SyncCallerStreams(const std::vector<at::Tensor>& tensors);

}  // namespace torch_backend
}  // namespace gossipcc
