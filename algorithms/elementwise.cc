#include "algorithms/elementwise.h"

#include <cstring>

#include "absl/strings/str_cat.h"

#if GOSSIPCC_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace gossipcc {
namespace gossip_internal {

namespace {

#if GOSSIPCC_WITH_CUDA
void CheckCuda(cudaError_t err, const std::string& algorithm, const char* what) {
  if (err != cudaSuccess) {
    throw InvalidArgumentError(absl::StrCat(algorithm, ": ", what, " failed: ", cudaGetErrorString(err)));
  }
}

void Copy(void* dst, const void* src, size_t bytes, int device, cudaMemcpyKind kind, const std::string& algorithm) {
  if (bytes == 0) return;
  CheckCuda(cudaSetDevice(device), algorithm, "cudaSetDevice");
  CheckCuda(cudaMemcpyAsync(dst, src, bytes, kind, /*stream=*/0), algorithm, "cudaMemcpyAsync");
  CheckCuda(cudaStreamSynchronize(0), algorithm, "cudaStreamSynchronize");
}
#endif

}  // namespace

size_t TotalCount(const std::vector<Buffer>& buffers) {
  size_t n = 0;
  for (const Buffer& b : buffers) n += b.count;
  return n;
}

DType CheckBuffers(const std::string& algorithm, const std::vector<Buffer>& buffers) {
  if (buffers.empty()) return DType::kFloat32;
  const DType dtype = buffers[0].dtype;
  const Device device = buffers[0].device;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    if (static_cast<int>(b.dtype) >= kNumDTypes) {
      throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " has an invalid dtype"));
    }
    if (!IsFloatingPoint(b.dtype)) {
      throw InvalidArgumentError(absl::StrCat(
          algorithm, ": buffer ", i, " is ", DTypeName(b.dtype),
          "; gossip averaging needs a floating dtype (float32, float64, float16 or bfloat16)"));
    }
    if (b.dtype != dtype) {
      throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " is ", DTypeName(b.dtype),
                                              " but buffer 0 is ", DTypeName(dtype),
                                              "; all buffers of one call must share a dtype"));
    }
    if (b.device != device) {
      throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " is on ", b.device.ToString(),
                                              " but buffer 0 is on ", device.ToString(),
                                              "; all buffers of one call must be on one device"));
    }
    if (b.device.is_cuda()) {
#if !GOSSIPCC_WITH_CUDA
      throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " is on ", b.device.ToString(),
                                              " but gossipcc was built without CUDA"));
#else
      if (b.device.index < 0) {
        throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " has CUDA device index ",
                                                b.device.index));
      }
#endif
    }
    if (b.data == nullptr && b.count > 0) {
      throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " (", b.ToString(), ") has null data"));
    }
  }
  return dtype;
}

HostStaging::HostStaging(const std::string& algorithm, const std::vector<Buffer>& buffers, bool load)
    : algorithm_(algorithm), original_(buffers), host_(buffers) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    if (!b.device.is_cuda()) continue;
#if GOSSIPCC_WITH_CUDA
    storage_.emplace_back((b.bytes() + 7) / 8);
    host_[i].data = storage_.back().data();
    host_[i].device = Device::CPU();
    if (load) Copy(host_[i].data, b.data, b.bytes(), b.device.index, cudaMemcpyDeviceToHost, algorithm_);
#else
    (void)load;
    throw InvalidArgumentError(absl::StrCat(algorithm, ": buffer ", i, " is on ", b.device.ToString(),
                                            " but gossipcc was built without CUDA"));
#endif
  }
}

void HostStaging::WriteBack() {
#if GOSSIPCC_WITH_CUDA
  for (size_t i = 0; i < original_.size(); ++i) {
    const Buffer& b = original_[i];
    if (!b.device.is_cuda()) continue;
    Copy(b.data, host_[i].data, b.bytes(), b.device.index, cudaMemcpyHostToDevice, algorithm_);
  }
#endif
}

}  // namespace gossip_internal
}  // namespace gossipcc
