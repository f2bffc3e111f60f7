// Test helpers for PowerSGD: deterministic per-rank gradients and a double-precision
// reference of one PowerSGD step over all ranks (written from the spec, independently of
// compression/power_sgd.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "compression/power_sgd.h"

namespace gossipcc {
namespace testing {

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t KeyHash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// Uniform in [-1, 1), a function of everything that identifies the element.
inline double GradValue(uint64_t seed, int rank, int step, const std::string& key, size_t i) {
  const uint64_t h = Mix(Mix(Mix(Mix(seed) ^ KeyHash(key)) ^ (static_cast<uint64_t>(rank) << 32 | step)) ^ i);
  return static_cast<double>(h >> 11) / 4503599627370496.0 - 1.0;
}

inline int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct TensorSpec {
  std::string key;
  std::vector<int64_t> shape;
};

// Row-major dense matrix in doubles.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), v(r * c, 0.0) {}
  double& operator()(int64_t i, int64_t j) { return v[i * cols + j]; }
  double operator()(int64_t i, int64_t j) const { return v[i * cols + j]; }
};

inline Mat Mul(const Mat& a, const Mat& b, bool transpose_a = false, bool transpose_b = false) {
  const int64_t n = transpose_a ? a.cols : a.rows, k = transpose_a ? a.rows : a.cols;
  const int64_t m = transpose_b ? b.rows : b.cols;
  Mat c(n, m);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += (transpose_a ? a(l, i) : a(i, l)) * (transpose_b ? b(j, l) : b(l, j));
      c(i, j) = s;
    }
  return c;
}

// Modified Gram-Schmidt in double precision (the output of a step depends only on span(P),
// so any orthonormalisation gives the same `out`).
inline void OrthonormalizeColumns(Mat& p) {
  for (int64_t i = 0; i < p.cols; ++i) {
    double norm = 0;
    for (int64_t k = 0; k < p.rows; ++k) norm += p(k, i) * p(k, i);
    norm = std::sqrt(norm);
    for (int64_t k = 0; k < p.rows; ++k) p(k, i) = norm > 0 ? p(k, i) / norm : 0;
    for (int64_t j = i + 1; j < p.cols; ++j) {
      double d = 0;
      for (int64_t k = 0; k < p.rows; ++k) d += p(k, i) * p(k, j);
      for (int64_t k = 0; k < p.rows; ++k) p(k, j) -= d * p(k, i);
    }
  }
}

// One compressed step of a matrix over all ranks: ms[j] = grad_j + error_j (updated to the new
// errors when error feedback is on), q the Q every rank starts from (m x r).
// Returns out (n x m); q becomes the all-reduced Q.
inline Mat ReferenceStep(std::vector<Mat>& ms, Mat& q, int iterations, bool error_feedback) {
  const int W = static_cast<int>(ms.size());
  const int64_t n = ms[0].rows, m = ms[0].cols, r = q.cols;
  Mat p(n, r);
  for (int it = 0; it < iterations; ++it) {
    p = Mat(n, r);
    for (const Mat& mj : ms) {
      Mat pj = Mul(mj, q);
      for (size_t k = 0; k < p.v.size(); ++k) p.v[k] += pj.v[k];
    }
    OrthonormalizeColumns(p);
    Mat qn(m, r);
    for (const Mat& mj : ms) {
      Mat qj = Mul(mj, p, /*transpose_a=*/true);
      for (size_t k = 0; k < qn.v.size(); ++k) qn.v[k] += qj.v[k] / W;
    }
    q = qn;
  }
  Mat out = Mul(p, q, false, /*transpose_b=*/true);
  for (Mat& mj : ms) {
    for (size_t k = 0; k < mj.v.size(); ++k) mj.v[k] = error_feedback ? mj.v[k] - out.v[k] : 0.0;
  }
  return out;
}

}  // namespace testing
}  // namespace gossipcc
