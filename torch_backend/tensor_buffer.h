// Tensor -> Buffer views, with the checks every c10d call makes; each error is an
// InvalidArgumentError naming `op` and the tensor.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm/types.h"

namespace gossipcc {
namespace torch_backend {

// The dtype `type` travels as (bool as uint8); complex and quantized ones are refused.
DType ToDType(at::ScalarType type, const char* op);
Device ToDevice(const at::Device& device, const char* op);

// A view of a dense, contiguous CPU or CUDA tensor; `what`: "input", "output[2]", ...
Buffer ToBuffer(const at::Tensor& tensor, const char* op, const std::string& what);

// The one tensor of `tensors` (one per rank and call, as ProcessGroupGloo on one device).
const at::Tensor& SingleTensor(const std::vector<at::Tensor>& tensors, const char* op, const char* what);

// Checks that every tensor in `tensors` has `reference`'s dtype, device and element count.
void CheckSameLayout(const std::vector<at::Tensor>& tensors, const at::Tensor& reference, const char* op,
                     const char* what);

// The algorithms' tensors: non-empty, contiguous, one float dtype, one device (CPU if `cpu_only`).
std::vector<Buffer> FloatingBuffers(const std::vector<at::Tensor>& tensors, const char* op, bool cpu_only = false);

// The caller's current CUDA stream on `tensor`'s device (comm/cuda_stream.h); null for CPU.
void* CallerStream(const at::Tensor& tensor);

// Blocks until the caller's current stream on each CUDA device of `tensors` is idle: for
// operations that read or write the tensors from another thread (no-op for CPU tensors).
void SyncCallerStreams(const std::vector<at::Tensor>& tensors);

}  // namespace torch_backend
}  // namespace gossipcc
