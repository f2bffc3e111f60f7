// PowerSGD's CPU math through Eigen: Maps over the caller's buffers (no copies of float32
// gradients), float16/bfloat16/float64 widened to a float32 scratch once.
#include <Eigen/Dense>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "comm/errors.h"
#include "comm/reduce.h"
#include "compression/power_sgd_math.h"

namespace gossipcc {
namespace compression {
namespace internal {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapM = Eigen::Map<RowMatrix>;
using ConstMapM = Eigen::Map<const RowMatrix>;

template <typename T>
bool Finite(const T* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i])) return false;
  }
  return true;
}

class CpuBackend : public MathBackend {
 public:
  Device device() const override { return Device::CPU(); }

  std::shared_ptr<void> Alloc(size_t bytes, bool zero) override {
    void* p = zero ? std::calloc(bytes == 0 ? 1 : bytes, 1) : std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  void Upload(const void* host, void* dst, size_t bytes) override { if (bytes) std::memcpy(dst, host, bytes); }
  void Download(const void* src, void* host, size_t bytes) override { if (bytes) std::memcpy(host, src, bytes); }
  void Copy(void* dst, const void* src, size_t bytes) override { if (bytes) std::memmove(dst, src, bytes); }

  bool AllFinite(const Buffer& b) override {
    switch (b.dtype) {
      case DType::kFloat32: return Finite(static_cast<const float*>(b.data), b.count);
      case DType::kFloat64: return Finite(static_cast<const double*>(b.data), b.count);
      case DType::kFloat16:
      case DType::kBFloat16: {
        // Exponent all ones <=> Inf or NaN.
        const uint16_t* p = static_cast<const uint16_t*>(b.data);
        const uint16_t mask = b.dtype == DType::kFloat16 ? 0x7C00 : 0x7F80;
        for (size_t i = 0; i < b.count; ++i) {
          if ((p[i] & mask) == mask) return false;
        }
        return true;
      }
      default: return true;
    }
  }

  float* LoadMatrix(const Buffer& grad, const float* error, float* scratch) override {
    const size_t n = grad.count;
    float* M = scratch;
    switch (grad.dtype) {
      case DType::kFloat32: M = static_cast<float*>(grad.data); break;
      case DType::kFloat64: {
        const double* g = static_cast<const double*>(grad.data);
        Eigen::Map<Eigen::VectorXf>(scratch, n) = Eigen::Map<const Eigen::VectorXd>(g, n).cast<float>();
        break;
      }
      case DType::kFloat16:
      case DType::kBFloat16: WidenToFloat(grad.data, grad.dtype, scratch, n); break;
      default: throw InvalidArgumentError(std::string("PowerSGD: cannot compress ") + DTypeName(grad.dtype));
    }
    if (error != nullptr) Eigen::Map<Eigen::VectorXf>(M, n) += Eigen::Map<const Eigen::VectorXf>(error, n);
    return M;
  }

  void MultiplyMQ(const float* M, const float* Q, float* P, int64_t n, int64_t m, int r) override {
    MapM(P, n, r).noalias() = ConstMapM(M, n, m) * ConstMapM(Q, m, r);
  }

  void MultiplyMtP(const float* M, const float* P, float* Q, int64_t n, int64_t m, int r) override {
    MapM(Q, m, r).noalias() = ConstMapM(M, n, m).transpose() * ConstMapM(P, n, r);
  }

  void Orthogonalize(float* P, int64_t n, int r, float eps) override {
    MapM p(P, n, r);
    if (r <= 2) {
      for (int i = 0; i < r; ++i) {
        auto col = p.col(i);
        const float norm = col.norm() + eps;
        if (norm > 0 && std::isfinite(norm)) col /= norm;
        else if (norm == 0) col.setZero();
        for (int j = i + 1; j < r; ++j) p.col(j) -= col.dot(p.col(j)) * col;
      }
      return;
    }
    // Householder QR: the thin Q replaces P. Zero columns give some unit vector orthogonal to
    // the others rather than NaN.
    Eigen::HouseholderQR<RowMatrix> qr(p);
    RowMatrix thin = qr.householderQ() * RowMatrix::Identity(n, r);
    p = thin;
  }

  void Finish(float* M, const float* P, const float* Q, int64_t n, int64_t m, int r, float* error,
              const Buffer& grad) override {
    // One pass over M (and the error memory): row i of out = P(i, :) Q^T, computed once and
    // used for both the error (M - out) and the result.
    MapM mm(M, n, m);
    ConstMapM p(P, n, r);
    const RowMatrix qt = ConstMapM(Q, m, r).transpose();  // r x m, small
    Eigen::Matrix<float, 1, Eigen::Dynamic> row(m);
    for (int64_t i = 0; i < n; ++i) {
      row.noalias() = p.row(i) * qt;
      if (error != nullptr) MapM(error, n, m).row(i) = mm.row(i) - row;
      mm.row(i) = row;
    }
    const size_t count = static_cast<size_t>(n * m);
    switch (grad.dtype) {
      case DType::kFloat32: break;  // M is the gradient's memory
      case DType::kFloat64:
        Eigen::Map<Eigen::VectorXd>(static_cast<double*>(grad.data), count) =
            Eigen::Map<const Eigen::VectorXf>(M, count).cast<double>();
        break;
      case DType::kFloat16:
      case DType::kBFloat16: NarrowFromFloat(M, 1.0f, grad.dtype, grad.data, count); break;
      default: break;
    }
  }

  void Synchronize() override {}
};

}  // namespace

std::unique_ptr<MathBackend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
