#include "torch_backend/tensor_buffer.h"

#include "comm/errors.h"

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

}  // namespace torch_backend
}  // namespace gossipcc
