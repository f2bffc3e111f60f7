// Element-wise CUDA kernels for PowerSGD (power_sgd_kernels.cu, compiled by nvcc through a
// genrule; see compression/BUILD.bazel). Host-callable launchers on the legacy default stream.
// dtype codes are gossipcc::DType values: 0 float32, 1 float64, 2 float16, 3 bfloat16.
#pragma once

#include <cstddef>

namespace gossipcc {
namespace compression {
namespace cuda_kernels {

// dst[i] = float(src[i]) (+ error[i] when error != nullptr), src of a non-float32 dtype.
// Returns a cudaError_t value (0: success).
int WidenAdd(const void* src, int dtype, const float* error, float* dst, size_t n);
// dst[i] = dtype(src[i]), round to nearest even.
int Narrow(const float* src, void* dst, int dtype, size_t n);
// Counts NaN/Inf elements of a float buffer into *device_count (device memory, zeroed first).
int CountNonFinite(const void* src, int dtype, size_t n, unsigned int* device_count);

}  // namespace cuda_kernels
}  // namespace compression
}  // namespace gossipcc
