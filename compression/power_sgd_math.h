// The linear algebra PowerSGD needs, behind one interface with a CPU implementation (Eigen,
// power_sgd_cpu.cc) and a CUDA one (cuBLAS plus small kernels, power_sgd_cuda.cc). Internal to
// compression/: PowerSGD (power_sgd.cc) owns the algorithm and the communication.
//
// Matrices are row-major float32, as PyTorch lays out a gradient viewed as shape[0] x rest:
// M is n x m, P is n x r, Q is m x r. Pointers are in the backend's memory space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/types.h"

namespace gossipcc {
namespace compression {
namespace internal {

class MathBackend {
 public:
  virtual ~MathBackend() = default;
  virtual Device device() const = 0;

  // Memory of `bytes` bytes in the backend's space (zero-filled when `zero`), freed when the
  // last owner drops it.
  virtual std::shared_ptr<void> Alloc(size_t bytes, bool zero = true) = 0;
  virtual void Upload(const void* host, void* dst, size_t bytes) = 0;
  virtual void Download(const void* src, void* host, size_t bytes) = 0;
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;

  // True if every element of a floating-point buffer is finite.
  virtual bool AllFinite(const Buffer& b) = 0;

  // M <- grad (+ error when `error` is not null), in float32. For a float32 gradient M is the
  // gradient's own memory (updated in place, returned); otherwise it is written to `scratch`
  // (n*m floats) and `scratch` is returned.
  virtual float* LoadMatrix(const Buffer& grad, const float* error, float* scratch) = 0;
  // P = (G + E) Q without writing G or E (E may be null: P = G Q). When `g_finite` is not
  // null it is set to whether every element of G is finite (the NaN/Inf scan in the same
  // pass). E and g_finite are CPU only (PowerSGD passes them only there: on CUDA, M comes from
  // LoadMatrix and the scan from AllFinite); the CUDA backend refuses them.
  virtual void MultiplyMQ(const float* G, const float* E, const float* Q, float* P, int64_t n, int64_t m, int r,
                          bool* g_finite) = 0;
  // Q = M^T P with M = G (+ E): when E is not null, G <- G + E is written in the same pass
  // (error feedback's M = grad + error without a pass of its own). E: CPU only, as above.
  virtual void MultiplyMtP(float* G, const float* E, const float* P, float* Q, int64_t n, int64_t m, int r) = 0;
  // Orthonormalises the r columns of P (n x r) in place: Gram-Schmidt with
  // col /= (norm + eps) for r <= 2, Householder QR otherwise (on CUDA: Gram-Schmidt always).
  // A zero column (norm + eps == 0) stays zero instead of becoming NaN.
  virtual void Orthogonalize(float* P, int64_t n, int r, float eps) = 0;
  // out = P Q^T; when `error` is not null, error = M - out; then grad <- out (rounded to the
  // gradient's dtype). M may be the gradient's memory.
  virtual void Finish(float* M, const float* P, const float* Q, int64_t n, int64_t m, int r, float* error,
                      const Buffer& grad) = 0;
  // Waits for queued device work (CUDA); nothing on CPU.
  virtual void Synchronize() = 0;
};

// Which compiled copy of the CPU kernels (the streamed passes over M) a CPU backend uses.
// kBest: AVX2 where the CPU has it, else the x86-64 baseline; the environment variable
// GOSSIPCC_POWERSGD_CPU_KERNELS=baseline|avx2 (any case) overrides it (for benchmarks). Both copies give
// bit-identical Finish results (no FMA); asking for AVX2 where it is missing throws.
enum class CpuKernels { kBest, kBaseline, kAvx2 };
std::unique_ptr<MathBackend> MakeCpuBackend(CpuKernels kernels = CpuKernels::kBest);
// "Baseline" or "Avx2": what MakeCpuBackend(kernels) would use here.
const char* CpuKernelsName(CpuKernels kernels = CpuKernels::kBest);
// Throws InvalidArgumentError when built without CUDA or when `ordinal` is not a usable device.
std::unique_ptr<MathBackend> MakeCudaBackend(int ordinal);

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
