// PowerSGD's linear algebra behind one interface (internal to compression/): CPU (own SIMD
// kernels and Eigen, power_sgd_cpu.cc) and CUDA (cuBLAS and small kernels, power_sgd_cuda.cc).
// Matrices are row-major float32 in the backend's memory: M n x m, P n x r, Q m x r.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/core/types.h"

namespace gossipcc {
namespace compression {
namespace internal {

class MathBackend {
 public:
  virtual ~MathBackend() = default;
  virtual Device device() const = 0;

  // Memory in the backend's space (zero-filled when `zero`).
  virtual std::shared_ptr<void> Alloc(size_t bytes, bool zero = true) = 0;
  virtual void Upload(const void* host, void* dst, size_t bytes) = 0;
  virtual void Download(const void* src, void* host, size_t bytes) = 0;
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;

  // True if every element of a floating-point buffer is finite.
  virtual bool AllFinite(const Buffer& b) = 0;

  // M <- grad (+ error) in float32: a float32 gradient's own memory, else `scratch`; returns M.
  virtual float* LoadMatrix(const Buffer& grad, const float* error, float* scratch) = 0;
  // P = (G + E) Q without writing G or E (E may be null); `g_finite` (if set) <- G all finite,
  // in the same pass. E and g_finite: CPU only.
  virtual void MultiplyMQ(const float* G, const float* E, const float* Q, float* P, int64_t n, int64_t m, int r,
                          bool* g_finite) = 0;
  // Q = M^T P with M = G (+ E); with E (CPU only) G <- G + E in the same pass.
  virtual void MultiplyMtP(float* G, const float* E, const float* P, float* Q, int64_t n, int64_t m, int r) = 0;
  // Orthonormalises P's columns in place (docs/powersgd.md); a zero column stays zero.
  virtual void Orthogonalize(float* P, int64_t n, int r, float eps) = 0;
  // out = P Q^T; error = M - out (when set); grad <- out in its dtype. M may be grad's memory.
  virtual void Finish(float* M, const float* P, const float* Q, int64_t n, int64_t m, int r, float* error,
                      const Buffer& grad) = 0;
  // Waits for queued device work (CUDA); nothing on CPU.
  virtual void Synchronize() = 0;
};

// Which compiled copy of the CPU kernels: kBest is AVX2 where the CPU has it (overridden by
// GOSSIPCC_POWERSGD_CPU_KERNELS); both give the same bits; AVX2 where missing throws.
enum class CpuKernels { kBest, kBaseline, kAvx2 };
std::unique_ptr<MathBackend> MakeCpuBackend(CpuKernels kernels = CpuKernels::kBest);
// "Baseline" or "Avx2": what MakeCpuBackend(kernels) would use here.
const char* CpuKernelsName(CpuKernels kernels = CpuKernels::kBest);
// Throws InvalidArgumentError when built without CUDA or when `ordinal` is not a usable device.
std::unique_ptr<MathBackend> MakeCudaBackend(int ordinal);

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
