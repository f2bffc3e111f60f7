// Tensor -> gossipcc::Buffer views, with the checks every c10d call makes on its arguments.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "comm/types.h"

namespace gossipcc {
namespace torch_backend {

// The dtype gossipcc moves `type` as; throws InvalidArgumentError naming `op` for dtypes it
// cannot (complex, quantized). bool travels as uint8 (the same bytes).
DType ToDType(at::ScalarType type, const char* op);
Device ToDevice(const at::Device& device, const char* op);

// A view of a dense, contiguous CPU or CUDA tensor; throws InvalidArgumentError naming `op`
// and `what` ("input", "output[2]") otherwise.
Buffer ToBuffer(const at::Tensor& tensor, const char* op, const std::string& what);

// Checks that `tensors` holds exactly one tensor (c10d passes lists; gossipcc runs one
// tensor per rank and per call, as ProcessGroupGloo does for a single device).
const at::Tensor& SingleTensor(const std::vector<at::Tensor>& tensors, const char* op, const char* what);

// Checks that every tensor in `tensors` has `reference`'s dtype, device and element count.
void CheckSameLayout(const std::vector<at::Tensor>& tensors, const at::Tensor& reference, const char* op,
                     const char* what);

// The gossip algorithms' (and PowerSGD's) tensor contract: a non-empty list of defined,
// contiguous tensors of one dtype among float32/float64/float16/bfloat16 and one device (CPU
// only if `cpu_only`). Returns their views; InvalidArgumentError naming `op` and the tensor.
std::vector<Buffer> FloatingBuffers(const std::vector<at::Tensor>& tensors, const char* op, bool cpu_only = false);

// The caller's current CUDA stream on `tensor`'s device, as a cudaStream_t for
// ScopedCudaStream (comm/cuda_stream.h); nullptr for a CPU tensor. Builds against a torch
// without CUDA (GOSSIPCC_TORCH_CUDA unset: third_party/torch.bzl) have no CUDA tensors.
void* CallerStream(const at::Tensor& tensor);

// Blocks until the caller's current stream on each CUDA device of `tensors` is idle: for
// operations that read or write the tensors from another thread (no-op for CPU tensors).
void SyncCallerStreams(const std::vector<at::Tensor>& tensors);

}  // namespace torch_backend
}  // namespace gossipcc
