// Linked instead of power_sgd_kernels.cu when the build machine has CUDA's headers but no
// nvcc (see the genrule in compression/BUILD.bazel): every launcher reports
// cudaErrorNotSupported (801), which the CUDA backend raises as an error naming the step.
// Without CUDA headers (GOSSIPCC_WITH_CUDA=0) nothing calls these.
#include <cstddef>

namespace gossipcc {
namespace compression {
namespace cuda_kernels {

constexpr int kNotSupported = 801;
int WidenAdd(const void*, int, const float*, float*, size_t) { return kNotSupported; }
int Narrow(const float*, void*, int, size_t) { return kNotSupported; }
int CountNonFinite(const void*, int, size_t, unsigned int*) { return kNotSupported; }

}  // namespace cuda_kernels
}  // namespace compression
}  // namespace gossipcc
