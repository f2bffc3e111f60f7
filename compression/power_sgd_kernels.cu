// PowerSGD's element-wise CUDA kernels: widening fp16/bf16/fp64 gradients to float32 (plus the
// error memory), rounding the result back, and the NaN/Inf scan. The GEMMs and the
// orthogonalisation are cuBLAS calls in power_sgd_cuda.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "compression/power_sgd_kernels.h"

namespace gossipcc {
namespace compression {
namespace cuda_kernels {
namespace {

constexpr int kThreads = 256;

__device__ float Load(const void* src, int dtype, size_t i) {
  switch (dtype) {
    case 0: return static_cast<const float*>(src)[i];
    case 1: return static_cast<float>(static_cast<const double*>(src)[i]);
    case 2: return __half2float(static_cast<const __half*>(src)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(src)[i]);
  }
}

__global__ void WidenAddKernel(const void* src, int dtype, const float* error, float* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x) {
    const float v = Load(src, dtype, i);
    dst[i] = error != nullptr ? v + error[i] : v;
  }
}

__global__ void NarrowKernel(const float* src, void* dst, int dtype, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x) {
    switch (dtype) {
      case 0: static_cast<float*>(dst)[i] = src[i]; break;
      case 1: static_cast<double*>(dst)[i] = src[i]; break;
      case 2: static_cast<__half*>(dst)[i] = __float2half_rn(src[i]); break;
      default: static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(src[i]); break;
    }
  }
}

__global__ void CountNonFiniteKernel(const void* src, int dtype, size_t n, unsigned int* count) {
  unsigned int local = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x) {
    const float v = dtype == 1 ? 0.0f : Load(src, dtype, i);
    const bool bad = dtype == 1 ? !isfinite(static_cast<const double*>(src)[i]) : !isfinite(v);
    local += bad ? 1u : 0u;
  }
  if (local) atomicAdd(count, local);
}

unsigned int Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(b < 4096 ? (b == 0 ? 1 : b) : 4096);
}

}  // namespace

int WidenAdd(const void* src, int dtype, const float* error, float* dst, size_t n) {
  if (n == 0) return 0;
  WidenAddKernel<<<Blocks(n), kThreads>>>(src, dtype, error, dst, n);
  return static_cast<int>(cudaGetLastError());
}

int Narrow(const float* src, void* dst, int dtype, size_t n) {
  if (n == 0) return 0;
  NarrowKernel<<<Blocks(n), kThreads>>>(src, dst, dtype, n);
  return static_cast<int>(cudaGetLastError());
}

int CountNonFinite(const void* src, int dtype, size_t n, unsigned int* device_count) {
  cudaError_t e = cudaMemsetAsync(device_count, 0, sizeof(unsigned int));
  if (e != cudaSuccess || n == 0) return static_cast<int>(e);
  CountNonFiniteKernel<<<Blocks(n), kThreads>>>(src, dtype, n, device_count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cuda_kernels
}  // namespace compression
}  // namespace gossipcc
