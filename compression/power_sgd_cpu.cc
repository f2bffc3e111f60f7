// PowerSGD's CPU math through Eigen: Maps over the caller's buffers (no copies of float32
// gradients), float16/bfloat16/float64 widened to a float32 scratch once.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "comm/errors.h"
#include "comm/reduce.h"
#include "compression/power_sgd_math.h"

namespace gossipcc {
namespace compression {
namespace internal {

void MathBackend::MultiplyMQPlusError(const float*, const float*, const float*, float*, int64_t, int64_t, int) {
  throw std::logic_error("PowerSGD: MultiplyMQPlusError is CPU-only; called on " + device().ToString());
}

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapM = Eigen::Map<RowMatrix>;
using ConstMapM = Eigen::Map<const RowMatrix>;

// x * 0 is 0 for finite x and NaN for Inf or NaN, so the sum is NaN exactly when some
// element is not finite. A vectorised reduction, about the cost of reading the buffer once
// (an element-wise std::isfinite loop cost PowerSGD as much as two passes over M).
template <typename T>
bool Finite(const T* p, size_t n) {
  if (n == 0) return true;
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  return !std::isnan((Eigen::Map<const Array>(p, static_cast<Eigen::Index>(n)) * T(0)).sum());
}

// The thin products below stream M in column blocks of this many floats: a block of every
// row of Q^T (r x kColumnBlock) stays in L1/L2 while M's rows go by once.
constexpr int64_t kColumnBlock = 2048;
// Up to this rank the products stream M once; above it Eigen's GEMM, whose packing of M is
// then amortised over enough columns.
constexpr int kStreamMaxRank = 16;

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

  // P(i, k) = M.row(i) . Q^T.row(k): every row of M is read from memory once and used for
  // all r columns while it is in cache. (Eigen's GEMM copies M into a packed layout first,
  // which for r = 1..4 costs more than the arithmetic.)
  void MultiplyMQ(const float* M, const float* Q, float* P, int64_t n, int64_t m, int r) override {
    MultiplyMQPlusError(M, nullptr, Q, P, n, m, r);
  }

  // The same with M = G + E formed a column block at a time in L1, never stored.
  void MultiplyMQPlusError(const float* G, const float* E, const float* Q, float* P, int64_t n, int64_t m,
                           int r) override {
    if (r > kStreamMaxRank) {
      if (E == nullptr) {
        MapM(P, n, r).noalias() = ConstMapM(G, n, m) * ConstMapM(Q, m, r);
      } else {
        MapM(P, n, r).noalias() = (ConstMapM(G, n, m) + ConstMapM(E, n, m)) * ConstMapM(Q, m, r);
      }
      return;
    }
    ConstMapM g(G, n, m);
    ConstMapM e(E != nullptr ? E : G, n, m);  // read only when E is given
    MapM p(P, n, r);
    qt_ = ConstMapM(Q, m, r).transpose();
    p.setZero();
    block_.resize(std::min(kColumnBlock, m));
    // P(i, :) += the segment [c, c + w) of M's row i times the same rows of Q.
    auto add_row = [&](int64_t i, int64_t c, const auto& row) {
      for (int k = 0; k < r; ++k) p(i, k) += row.dot(qt_.row(k).segment(c, row.size()));
    };
    for (int64_t c = 0; c < m; c += kColumnBlock) {
      const int64_t w = std::min(kColumnBlock, m - c);
      for (int64_t i = 0; i < n; ++i) {
        if (E == nullptr) {
          add_row(i, c, g.row(i).segment(c, w));
        } else {
          block_.head(w) = g.row(i).segment(c, w) + e.row(i).segment(c, w);
          add_row(i, c, block_.head(w));
        }
      }
    }
  }

  // Q^T.row(k) += P(i, k) M.row(i) over the rows of M, again one pass over M; Q^T is then
  // transposed into Q (m x r, small).
  void MultiplyMtP(const float* M, const float* P, float* Q, int64_t n, int64_t m, int r) override {
    if (r > kStreamMaxRank) {
      MapM(Q, m, r).noalias() = ConstMapM(M, n, m).transpose() * ConstMapM(P, n, r);
      return;
    }
    ConstMapM mm(M, n, m);
    ConstMapM p(P, n, r);
    qt_.setZero(r, m);
    for (int64_t c = 0; c < m; c += kColumnBlock) {
      const int64_t w = std::min(kColumnBlock, m - c);
      for (int64_t i = 0; i < n; ++i) {
        const auto row = mm.row(i).segment(c, w);
        for (int k = 0; k < r; ++k) qt_.row(k).segment(c, w) += p(i, k) * row;
      }
    }
    MapM(Q, m, r) = qt_.transpose();
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
    qt_ = ConstMapM(Q, m, r).transpose();  // r x m, small
    row_.resize(m);
    for (int64_t i = 0; i < n; ++i) {
      // row = sum_k P(i, k) Q^T.row(k) as r vectorised passes in L1 (a 1 x r by r x m
      // product per row would go through Eigen's GEMV dispatch n times).
      row_ = p(i, 0) * qt_.row(0);
      for (int k = 1; k < r; ++k) row_ += p(i, k) * qt_.row(k);
      if (error != nullptr) MapM(error, n, m).row(i) = mm.row(i) - row_;
      mm.row(i) = row_;
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

 private:
  // Kept between calls to avoid allocations: Q^T (r x m) for the streamed products and
  // Finish, and Finish's output row.
  RowMatrix qt_;
  Eigen::Matrix<float, 1, Eigen::Dynamic> row_, block_;
};

}  // namespace

std::unique_ptr<MathBackend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
