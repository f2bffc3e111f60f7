// PowerSGD's CUDA math: cuBLAS for the GEMMs, the error update (a GEMM with beta = 1) and
// Gram-Schmidt (nrm2/scal/dot/axpy on strided columns); element-wise kernels of our own
// (power_sgd_kernels.cu) for dtype conversion and the NaN/Inf scan. Everything runs on the
// legacy default stream, which the comm layer's NCCL path waits on before a collective.
#include <stdexcept>
#include <string>

#include "comm/core/errors.h"
#include "compression/power_sgd_math.h"

#if GOSSIPCC_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "compression/power_sgd_kernels.h"
#endif

namespace gossipcc {
namespace compression {
namespace internal {

#if GOSSIPCC_WITH_CUDA
namespace {

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CommError(absl::StrCat("PowerSGD CUDA: ", what, ": ", cudaGetErrorString(e)));
}
void CheckKernel(int e, const char* what) { CheckCuda(static_cast<cudaError_t>(e), what); }
void CheckBlas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw CommError(absl::StrCat("PowerSGD cuBLAS: ", what, " failed with status ", static_cast<int>(s)));
}

// The products' error term and NaN/Inf scan are CPU only (PowerSGD adds the error with
// LoadMatrix and scans with AllFinite on CUDA).
void RefuseCpuOnlyTerms(const float* error, bool scan, const char* what) {
  if (error != nullptr || scan) {
    throw std::logic_error(std::string("PowerSGD CUDA: ") + what + " was given an error term or a NaN/Inf scan, " +
                           "which only the CPU path fuses");
  }
}

class CudaBackend : public MathBackend {
 public:
  explicit CudaBackend(int ordinal) : ordinal_(ordinal) {
    Use();
    CheckBlas(cublasCreate(&handle_), "cublasCreate");
    CheckBlas(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    CheckCuda(cudaMalloc(&flag_, sizeof(unsigned int)), "cudaMalloc");
  }
  ~CudaBackend() override {
    cudaSetDevice(ordinal_);
    cudaFree(flag_);
    cublasDestroy(handle_);
  }

  Device device() const override { return Device::CUDA(ordinal_); }

  std::shared_ptr<void> Alloc(size_t bytes, bool zero) override {
    Use();
    void* p = nullptr;
    CheckCuda(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
    if (zero) CheckCuda(cudaMemset(p, 0, bytes == 0 ? 1 : bytes), "cudaMemset");
    const int ordinal = ordinal_;
    return std::shared_ptr<void>(p, [ordinal](void* q) {
      cudaSetDevice(ordinal);
      cudaFree(q);
    });
  }
  void Upload(const void* host, void* dst, size_t bytes) override {
    Use();
    if (bytes) CheckCuda(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  void Download(const void* src, void* host, size_t bytes) override {
    Use();
    if (bytes) CheckCuda(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    Use();
    if (bytes) CheckCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0), "cudaMemcpyAsync");
  }

  bool AllFinite(const Buffer& b) override {
    Use();
    CheckKernel(cuda_kernels::CountNonFinite(b.data, static_cast<int>(b.dtype), b.count, flag_), "NaN/Inf scan");
    unsigned int count = 0;
    CheckCuda(cudaMemcpy(&count, flag_, sizeof(count), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return count == 0;
  }

  float* LoadMatrix(const Buffer& grad, const float* error, float* scratch) override {
    Use();
    if (grad.dtype == DType::kFloat32) {
      float* M = static_cast<float*>(grad.data);
      if (error != nullptr) {
        const float one = 1;
        Axpy(grad.count, one, error, M);
      }
      return M;
    }
    CheckKernel(cuda_kernels::WidenAdd(grad.data, static_cast<int>(grad.dtype), error, scratch, grad.count), "widen");
    return scratch;
  }

  // Row-major X (a x b) is column-major X^T with leading dimension b.
  void MultiplyMQ(const float* M, const float* E, const float* Q, float* P, int64_t n, int64_t m, int r,
                  bool* g_finite) override {
    RefuseCpuOnlyTerms(E, g_finite != nullptr, "P = M Q");
    Use();
    const float one = 1, zero = 0;
    // P^T (r x n) = Q^T (r x m) * M^T (m x n)
    CheckBlas(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, r, Int(n), Int(m), &one, Q, r, M, Int(m), &zero, P, r),
              "sgemm P = M Q");
  }

  void MultiplyMtP(float* M, const float* E, const float* P, float* Q, int64_t n, int64_t m, int r) override {
    RefuseCpuOnlyTerms(E, false, "Q = M^T P");
    Use();
    const float one = 1, zero = 0;
    // Q^T (r x m) = P^T (r x n) * M (n x m)
    CheckBlas(cublasSgemm(handle_, CUBLAS_OP_N, CUBLAS_OP_T, r, Int(m), Int(n), &one, P, r, M, Int(m), &zero, Q, r),
              "sgemm Q = M^T P");
  }

  void Orthogonalize(float* P, int64_t n, int r, float eps) override {
    Use();
    // Gram-Schmidt on the strided columns of row-major P; repeated once for r > 2
    // ("twice is enough") instead of a Householder QR, which cuBLAS does not offer.
    const int passes = r > 2 ? 2 : 1;
    for (int pass = 0; pass < passes; ++pass) {
      for (int i = 0; i < r; ++i) {
        float norm = 0;
        CheckBlas(cublasSnrm2(handle_, Int(n), P + i, r, &norm), "snrm2");
        const float denom = norm + eps;
        if (denom > 0) {
          const float inv = 1.0f / denom;
          CheckBlas(cublasSscal(handle_, Int(n), &inv, P + i, r), "sscal");
        }
        for (int j = i + 1; j < r; ++j) {
          float dot = 0;
          CheckBlas(cublasSdot(handle_, Int(n), P + i, r, P + j, r, &dot), "sdot");
          const float minus = -dot;
          CheckBlas(cublasSaxpy(handle_, Int(n), &minus, P + i, r, P + j, r), "saxpy");
        }
      }
    }
  }

  void Finish(float* M, const float* P, const float* Q, int64_t n, int64_t m, int r, float* error,
              const Buffer& grad) override {
    Use();
    const float one = 1, minus_one = -1, zero = 0;
    const size_t count = static_cast<size_t>(n * m);
    if (error != nullptr) {
      // error = M - P Q^T: copy M, then a GEMM with alpha = -1, beta = 1.
      Copy(error, M, count * sizeof(float));
      CheckBlas(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, Int(m), Int(n), r, &minus_one, Q, r, P, r, &one, error,
                            Int(m)),
                "sgemm error");
    }
    // out^T (m x n) = Q (m x r) * P^T (r x n), into M.
    CheckBlas(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, Int(m), Int(n), r, &one, Q, r, P, r, &zero, M, Int(m)),
              "sgemm out");
    if (grad.dtype != DType::kFloat32) {
      CheckKernel(cuda_kernels::Narrow(M, grad.data, static_cast<int>(grad.dtype), count), "narrow");
    }
  }

  void Synchronize() override {
    Use();
    CheckCuda(cudaStreamSynchronize(0), "cudaStreamSynchronize");
  }

 private:
  void Use() { CheckCuda(cudaSetDevice(ordinal_), "cudaSetDevice"); }
  static int Int(int64_t v) {
    if (v > INT32_MAX) throw InvalidArgumentError(absl::StrCat("PowerSGD CUDA: dimension ", v, " exceeds cuBLAS's int range"));
    return static_cast<int>(v);
  }
  void Axpy(size_t count, float alpha, const float* x, float* y) {
    // cuBLAS takes int counts: chunk larger vectors.
    const size_t chunk = size_t{1} << 30;
    for (size_t off = 0; off < count; off += chunk) {
      const int len = static_cast<int>(std::min(chunk, count - off));
      CheckBlas(cublasSaxpy(handle_, len, &alpha, x + off, 1, y + off, 1), "saxpy");
    }
  }

  const int ordinal_;
  cublasHandle_t handle_ = nullptr;
  unsigned int* flag_ = nullptr;
};

}  // namespace

std::unique_ptr<MathBackend> MakeCudaBackend(int ordinal) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (ordinal < 0 || ordinal >= count) {
    throw InvalidArgumentError(absl::StrCat("PowerSGD: tensors on cuda:", ordinal, " but ", count,
                                            " CUDA device(s) are visible"));
  }
  return std::make_unique<CudaBackend>(ordinal);
}

#else

std::unique_ptr<MathBackend> MakeCudaBackend(int ordinal) {
  throw InvalidArgumentError("PowerSGD: tensors on cuda:" + std::to_string(ordinal) +
                             " but gossipcc was built without CUDA (no /usr/local/cuda at build time)");
}

#endif

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
