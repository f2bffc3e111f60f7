#include "torch_backend/tensor_buffer.h"

#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#if GOSSIPCC_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>

#include "comm/core/errors.h"

namespace gossipcc {
namespace torch_backend {

DType ToDType(at::ScalarType type, const char* op) {
  switch (type) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kChar: return DType::kInt8;
    case at::kByte: return DType::kUInt8;
    case at::kBool: return DType::kUInt8;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    default:
      throw InvalidArgumentError(std::string("gossipcc ") + op + ": unsupported tensor dtype " +
                                 c10::toString(type) +
                                 " (supported: float32, float64, float16, bfloat16, int8, uint8, bool, int32, int64)");
  }
}

Device ToDevice(const at::Device& device, const char* op) {
  if (device.is_cpu()) return Device::CPU();
  if (device.is_cuda()) return Device::CUDA(device.has_index() ? device.index() : 0);
  throw InvalidArgumentError(std::string("gossipcc ") + op + ": unsupported device " + device.str() +
                             " (supported: cpu, cuda)");
}

// bool tensors reduce as logical or/and (sum/max -> max, product/min -> min), as torch's NCCL
// backend does; bitwise ops take integer and bool tensors (bool as uint8 0/1: logical
// and/or/xor), the comm layer refusing floating dtypes and CUDA tensors with the op named.
ReduceOp ToReduceOp(const ::c10d::ReduceOp& op, const at::Tensor& tensor, const char* where) {
  const bool is_bool = tensor.scalar_type() == at::kBool;
  auto unsupported = [where](const char* what) {
    return InvalidArgumentError(std::string("gossipcc backend does not support ") + where + " with " + what);
  };
  switch (static_cast<::c10d::ReduceOp::RedOpType>(op)) {
    case ::c10d::ReduceOp::SUM: return is_bool ? ReduceOp::kMax : ReduceOp::kSum;
    case ::c10d::ReduceOp::AVG:
      if (is_bool) throw unsupported("ReduceOp.AVG on bool tensors");
      return ReduceOp::kAvg;
    case ::c10d::ReduceOp::PRODUCT: return is_bool ? ReduceOp::kMin : ReduceOp::kProduct;
    case ::c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case ::c10d::ReduceOp::MAX: return ReduceOp::kMax;
    case ::c10d::ReduceOp::BAND: return ReduceOp::kBand;
    case ::c10d::ReduceOp::BOR: return ReduceOp::kBor;
    case ::c10d::ReduceOp::BXOR: return ReduceOp::kBxor;
    default: throw unsupported("this ReduceOp (PREMUL_SUM or unknown)");
  }
}

at::Tensor Flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void Unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (at::Tensor& t : tensors) {
    const int64_t n = t.numel();
    t.copy_(flat.narrow(0, offset, n).view(t.sizes()));
    offset += n;
  }
}

StagedTensor Stage(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.is_sparse() || tensor.is_contiguous()) return StagedTensor{tensor, tensor};
  return StagedTensor{tensor, tensor.contiguous()};
}

Buffer ToBuffer(const at::Tensor& tensor, const char* op, const std::string& what) {
  if (!tensor.defined()) {
    throw InvalidArgumentError(std::string("gossipcc ") + op + ": " + what + " is an undefined tensor");
  }
  if (tensor.is_sparse()) {
    throw InvalidArgumentError(std::string("gossipcc ") + op + ": " + what + " is a sparse tensor (only dense tensors are supported)");
  }
  if (!tensor.is_contiguous()) {
    throw InvalidArgumentError(std::string("gossipcc ") + op + ": " + what +
                               " is not contiguous (call .contiguous() first); sizes " + c10::str(tensor.sizes()) +
                               ", strides " + c10::str(tensor.strides()));
  }
  Buffer buffer;
  buffer.dtype = ToDType(tensor.scalar_type(), op);
  buffer.device = ToDevice(tensor.device(), op);
  buffer.count = static_cast<size_t>(tensor.numel());
  buffer.data = tensor.numel() == 0 ? nullptr : tensor.data_ptr();
  return buffer;
}

const at::Tensor& SingleTensor(const std::vector<at::Tensor>& tensors, const char* op, const char* what) {
  if (tensors.size() != 1) {
    throw InvalidArgumentError(std::string("gossipcc ") + op + ": expects exactly one " + what + " tensor per rank, got " +
                               std::to_string(tensors.size()));
  }
  return tensors[0];
}

void CheckSameLayout(const std::vector<at::Tensor>& tensors, const at::Tensor& reference, const char* op,
                     const char* what) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (t.scalar_type() != reference.scalar_type() || t.device() != reference.device() ||
        t.numel() != reference.numel()) {
      throw InvalidArgumentError(std::string("gossipcc ") + op + ": " + what + "[" + std::to_string(i) + "] is " +
                                 c10::str(t.numel(), " x ", t.scalar_type(), " on ", t.device()) + ", expected " +
                                 c10::str(reference.numel(), " x ", reference.scalar_type(), " on ", reference.device()));
    }
  }
}

// The gossip algorithms' tensor contract: a non-empty list of contiguous tensors of one
// floating dtype and one device.
std::vector<Buffer> FloatingBuffers(const std::vector<at::Tensor>& tensors, const char* op, bool cpu_only) {
  if (tensors.empty()) throw InvalidArgumentError(std::string("gossipcc ") + op + ": empty tensor list");
  std::vector<Buffer> buffers;
  buffers.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const std::string what = "tensor[" + std::to_string(i) + "]";
    if (!t.defined()) throw InvalidArgumentError(std::string("gossipcc ") + op + ": " + what + " is undefined");
    const at::ScalarType st = t.scalar_type();
    if (st != at::kFloat && st != at::kDouble && st != at::kHalf && st != at::kBFloat16) {
      throw InvalidArgumentError(std::string("gossipcc ") + op + ": " + what + " has dtype " +
                                 c10::toString(st) + "; gossip needs float32, float64, float16 or bfloat16");
    }
    if (st != tensors[0].scalar_type() || t.device() != tensors[0].device()) {
      throw InvalidArgumentError(std::string("gossipcc ") + op + ": " + what + " is " +
                                 c10::str(st, " on ", t.device()) + ", tensor[0] is " +
                                 c10::str(tensors[0].scalar_type(), " on ", tensors[0].device()) +
                                 " (all must share dtype and device)");
    }
    if (cpu_only && !t.is_cpu()) {
      throw InvalidArgumentError(std::string("gossipcc ") + op + ": " + what + " is on " + t.device().str() +
                                 "; this operation takes CPU tensors only");
    }
    buffers.push_back(ToBuffer(t, op, what));
  }
  return buffers;
}

void* CallerStream(const at::Tensor& tensor) {
#if GOSSIPCC_TORCH_CUDA
  if (tensor.defined() && tensor.is_cuda()) return c10::cuda::getCurrentCUDAStream(tensor.device().index()).stream();
#endif
  return nullptr;
}

void SyncCallerStreams(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> done;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.is_cuda() || std::find(done.begin(), done.end(), t.device()) != done.end()) continue;
    done.push_back(t.device());
    c10::impl::VirtualGuardImpl impl(t.device().type());
    impl.getStream(t.device()).synchronize();
  }
}

}  // namespace torch_backend
}  // namespace gossipcc
