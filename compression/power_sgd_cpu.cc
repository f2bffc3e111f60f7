// PowerSGD's CPU math: the passes over M are SIMD kernels of our own (below), Eigen does the
// rest (QR, GEMMs above rank 16, float64 conversions). No copies of float32 gradients;
// float16/bfloat16/float64 are widened to a float32 scratch once.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/core/errors.h"
#include "comm/core/reduce.h"
#include "compression/power_sgd_math.h"

namespace gossipcc {
namespace compression {
namespace internal {

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

// ---- explicit SIMD kernels ----
// The streamed passes over M are written once on GCC/Clang vector types and compiled twice:
// for AVX2 (8 floats per vector) and for the x86-64 baseline SSE2 (4 floats), the former
// chosen at run time where the CPU has it. (The library is built for the baseline, where
// Eigen's own kernels use 4-float vectors.) Every helper is always_inline, so each copy is
// compiled for its caller's instruction set and nothing is shared between the two.
// FMA is deliberately not enabled: Finish computes each output element with the same
// multiplies and adds in the same order in both copies (and in the scalar tails), so ranks on
// CPUs with and without AVX2 still produce bit-identical results. The dot products of the
// products differ in summation order between the copies; they only feed all-reduces.
#define GOSSIPCC_INLINE inline __attribute__((always_inline))

#if defined(__GNUC__) && !defined(__clang__)
// GCC warns that a 32-byte vector passed by value outside AVX code has another ABI; every
// function taking or returning one is always_inline, so no such call exists.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float Float4 __attribute__((vector_size(16)));
typedef float Float8 __attribute__((vector_size(32)));

template <class V>
constexpr int kLanes = static_cast<int>(sizeof(V) / sizeof(float));

template <class V>
GOSSIPCC_INLINE V LoadV(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V>
GOSSIPCC_INLINE void StoreV(float* p, const V& v) { std::memcpy(p, &v, sizeof(V)); }
template <class V>
GOSSIPCC_INLINE V Splat(float x) { return V{} + x; }
template <class V>
GOSSIPCC_INLINE float HorizontalSum(const V& v) {
  float s = 0;
  for (int l = 0; l < kLanes<V>; ++l) s += v[l];
  return s;
}

// sum_j a[j] * b[j], two vector accumulators.
template <class V>
GOSSIPCC_INLINE float Dot(const float* a, const float* b, int64_t w) {
  constexpr int L = kLanes<V>;
  V s0{}, s1{};
  int64_t j = 0;
  for (; j + 2 * L <= w; j += 2 * L) {
    s0 += LoadV<V>(a + j) * LoadV<V>(b + j);
    s1 += LoadV<V>(a + j + L) * LoadV<V>(b + j + L);
  }
  for (; j + L <= w; j += L) s0 += LoadV<V>(a + j) * LoadV<V>(b + j);
  float s = HorizontalSum(s0 + s1);
  for (; j < w; ++j) s += a[j] * b[j];
  return s;
}

// out[j] = a[j] + b[j] (out may be a).
template <class V>
GOSSIPCC_INLINE void Add(const float* a, const float* b, float* out, int64_t w) {
  constexpr int L = kLanes<V>;
  int64_t j = 0;
  for (; j + L <= w; j += L) StoreV(out + j, LoadV<V>(a + j) + LoadV<V>(b + j));
  for (; j < w; ++j) out[j] = a[j] + b[j];
}

// y[j] += alpha * x[j].
template <class V>
GOSSIPCC_INLINE void Axpy(float alpha, const float* x, float* y, int64_t w) {
  constexpr int L = kLanes<V>;
  const V a = Splat<V>(alpha);
  int64_t j = 0;
  for (; j + L <= w; j += L) StoreV(y + j, LoadV<V>(y + j) + a * LoadV<V>(x + j));
  for (; j < w; ++j) y[j] += alpha * x[j];
}

// True when no element is Inf or NaN: x * 0 is NaN exactly for those, and NaN survives a sum.
template <class V>
GOSSIPCC_INLINE bool AllFiniteBody(const float* x, int64_t n) {
  constexpr int L = kLanes<V>;
  V probe{};
  int64_t j = 0;
  for (; j + L <= n; j += L) probe += LoadV<V>(x + j) * V{};
  float tail = 0;
  for (; j < n; ++j) tail += x[j] * 0.0f;
  return !std::isnan(HorizontalSum(probe) + tail);
}

// P = (G + E) Q with Q given as Q^T (r x m, row k contiguous); E may be null. Every row of M
// is read once per column block and used for all r columns while it is in L1; G + E is
// formed in `block` (kColumnBlock floats), never stored. With `g_finite`: also whether every
// element of G is finite (G's row segment is in L1 then, so the scan costs no memory pass).
template <class V>
GOSSIPCC_INLINE void ProductMQ(const float* G, const float* E, const float* qt, float* P, int64_t n, int64_t m, int r,
                               float* block, bool* g_finite) {
  constexpr int L = kLanes<V>;
  std::fill(P, P + n * r, 0.0f);
  V probe{};
  float probe_tail = 0;
  for (int64_t c = 0; c < m; c += kColumnBlock) {
    const int64_t w = std::min(kColumnBlock, m - c);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = G + i * m + c;
      if (g_finite != nullptr) {
        int64_t j = 0;
        for (; j + L <= w; j += L) probe += LoadV<V>(row + j) * V{};
        for (; j < w; ++j) probe_tail += row[j] * 0.0f;
      }
      if (E != nullptr) {
        Add<V>(row, E + i * m + c, block, w);
        row = block;
      }
      for (int k = 0; k < r; ++k) P[i * r + k] += Dot<V>(row, qt + k * m + c, w);
    }
  }
  if (g_finite != nullptr) *g_finite = !std::isnan(HorizontalSum(probe) + probe_tail);
}

// Q^T (r x m) = M^T P, one pass over M. With E: M = G + E is formed in that pass and
// written to G (error feedback's M <- grad + error without a pass of its own).
template <class V>
GOSSIPCC_INLINE void ProductMtP(float* G, const float* E, const float* P, float* qt, int64_t n, int64_t m, int r) {
  std::fill(qt, qt + r * m, 0.0f);
  for (int64_t c = 0; c < m; c += kColumnBlock) {
    const int64_t w = std::min(kColumnBlock, m - c);
    for (int64_t i = 0; i < n; ++i) {
      float* row = G + i * m + c;
      if (E != nullptr) Add<V>(row, E + i * m + c, row, w);
      for (int k = 0; k < r; ++k) Axpy<V>(P[i * r + k], row, qt + k * m + c, w);
    }
  }
}

// out = P Q^T row by row; error = M - out where error is given; M <- out. Each element of
// out is p0*q0 + p1*q1 + ... in that order, vector lanes and scalar tail alike.
template <class V>
GOSSIPCC_INLINE void FinishBody(float* M, const float* P, const float* qt, int64_t n, int64_t m, int r,
                                float* error) {
  constexpr int L = kLanes<V>;
  for (int64_t i = 0; i < n; ++i) {
    const float* p = P + i * r;
    float* row = M + i * m;
    float* err = error != nullptr ? error + i * m : nullptr;
    int64_t j = 0;
    for (; j + L <= m; j += L) {
      V out = Splat<V>(p[0]) * LoadV<V>(qt + j);
      for (int k = 1; k < r; ++k) out += Splat<V>(p[k]) * LoadV<V>(qt + k * m + j);
      if (err != nullptr) StoreV(err + j, LoadV<V>(row + j) - out);
      StoreV(row + j, out);
    }
    for (; j < m; ++j) {
      float out = p[0] * qt[j];
      for (int k = 1; k < r; ++k) out += p[k] * qt[k * m + j];
      if (err != nullptr) err[j] = row[j] - out;
      row[j] = out;
    }
  }
}

struct Kernels {
  const char* name;
  bool (*all_finite)(const float*, int64_t);
  void (*add)(const float*, const float*, float*, int64_t);
  void (*product_mq)(const float*, const float*, const float*, float*, int64_t, int64_t, int, float*, bool*);
  void (*product_mtp)(float*, const float*, const float*, float*, int64_t, int64_t, int);
  void (*finish)(float*, const float*, const float*, int64_t, int64_t, int, float*);
};

#define GOSSIPCC_KERNELS(NAME, TARGET, V)                                                                          \
  TARGET bool AllFinite##NAME(const float* x, int64_t n) { return AllFiniteBody<V>(x, n); }                       \
  TARGET void Add##NAME(const float* a, const float* b, float* out, int64_t w) { Add<V>(a, b, out, w); }           \
  TARGET void ProductMQ##NAME(const float* G, const float* E, const float* qt, float* P, int64_t n, int64_t m,      \
                              int r, float* block, bool* g_finite) {                                               \
    ProductMQ<V>(G, E, qt, P, n, m, r, block, g_finite);                                                           \
  }                                                                                                                \
  TARGET void ProductMtP##NAME(float* G, const float* E, const float* P, float* qt, int64_t n, int64_t m, int r) { \
    ProductMtP<V>(G, E, P, qt, n, m, r);                                                                           \
  }                                                                                                                \
  TARGET void Finish##NAME(float* M, const float* P, const float* qt, int64_t n, int64_t m, int r, float* error) { \
    FinishBody<V>(M, P, qt, n, m, r, error);                                                                       \
  }                                                                                                                \
  const Kernels k##NAME##Kernels = {#NAME, AllFinite##NAME, Add##NAME, ProductMQ##NAME, ProductMtP##NAME,         \
                                    Finish##NAME};

GOSSIPCC_KERNELS(Baseline, , Float4)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
GOSSIPCC_KERNELS(Avx2, __attribute__((target("avx2"))), Float8)
#define GOSSIPCC_HAVE_AVX2_KERNELS 1
#endif

const Kernels& SelectKernels(CpuKernels which) {
  if (which == CpuKernels::kBest) {
    if (const char* env = std::getenv("GOSSIPCC_POWERSGD_CPU_KERNELS"); env != nullptr && *env != '\0') {
      const std::string v = env;
      std::string lower = v;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (lower == "baseline") which = CpuKernels::kBaseline;
      else if (lower == "avx2") which = CpuKernels::kAvx2;
      else throw InvalidArgumentError("GOSSIPCC_POWERSGD_CPU_KERNELS='" + v + "': expected baseline or avx2");
    }
  }
#ifdef GOSSIPCC_HAVE_AVX2_KERNELS
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  if (which == CpuKernels::kAvx2 && !has_avx2) throw InvalidArgumentError("PowerSGD: AVX2 kernels requested on a CPU without AVX2");
  if (which == CpuKernels::kAvx2 || (which == CpuKernels::kBest && has_avx2)) return kAvx2Kernels;
#else
  if (which == CpuKernels::kAvx2) throw InvalidArgumentError("PowerSGD: AVX2 kernels are not built for this CPU architecture");
#endif
  return kBaselineKernels;
}

class CpuBackend : public MathBackend {
 public:
  explicit CpuBackend(const Kernels& kernels) : kernels_(kernels) {}
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
      case DType::kFloat32: return kernels_.all_finite(static_cast<const float*>(b.data), static_cast<int64_t>(b.count));
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
    if (error != nullptr) kernels_.add(M, error, M, static_cast<int64_t>(n));
    return M;
  }

  void MultiplyMQ(const float* G, const float* E, const float* Q, float* P, int64_t n, int64_t m, int r,
                  bool* g_finite) override {
    if (r > kStreamMaxRank) {
      if (g_finite != nullptr) *g_finite = kernels_.all_finite(G, n * m);
      if (E == nullptr) {
        MapM(P, n, r).noalias() = ConstMapM(G, n, m) * ConstMapM(Q, m, r);
      } else {
        MapM(P, n, r).noalias() = (ConstMapM(G, n, m) + ConstMapM(E, n, m)) * ConstMapM(Q, m, r);
      }
      return;
    }
    TransposeQ(Q, m, r);
    block_.resize(static_cast<size_t>(std::min(kColumnBlock, m)));
    kernels_.product_mq(G, E, qt_.data(), P, n, m, r, block_.data(), g_finite);
  }

  void MultiplyMtP(float* G, const float* E, const float* P, float* Q, int64_t n, int64_t m, int r) override {
    if (r > kStreamMaxRank) {
      if (E != nullptr) kernels_.add(G, E, G, n * m);
      MapM(Q, m, r).noalias() = ConstMapM(G, n, m).transpose() * ConstMapM(P, n, r);
      return;
    }
    qt_.resize(static_cast<size_t>(r * m));
    kernels_.product_mtp(G, E, P, qt_.data(), n, m, r);
    for (int64_t j = 0; j < m; ++j) {
      for (int k = 0; k < r; ++k) Q[j * r + k] = qt_[k * m + j];
    }
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
    // One pass over M (and the error memory): each row of out = P Q^T is computed once and
    // used for both the error (M - out) and the result.
    TransposeQ(Q, m, r);
    kernels_.finish(M, P, qt_.data(), n, m, r, error);
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
  // qt_ = Q^T (r x m), so that the kernels read each of Q's columns contiguously.
  void TransposeQ(const float* Q, int64_t m, int r) {
    qt_.resize(static_cast<size_t>(r * m));
    for (int64_t j = 0; j < m; ++j) {
      for (int k = 0; k < r; ++k) qt_[k * m + j] = Q[j * r + k];
    }
  }

  const Kernels& kernels_;
  // Kept between calls to avoid allocations: Q^T for the products and Finish, and the
  // product's block of G + E.
  std::vector<float> qt_, block_;
};

}  // namespace

std::unique_ptr<MathBackend> MakeCpuBackend(CpuKernels kernels) {
  return std::make_unique<CpuBackend>(SelectKernels(kernels));
}

const char* CpuKernelsName(CpuKernels kernels) { return SelectKernels(kernels).name; }

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
