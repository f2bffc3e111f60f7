// PowerSGD's CPU math backend (compression/power_sgd_cpu.cc): every streamed kernel, in every
// compiled copy this CPU can run (the x86-64 baseline and AVX2), against a double-precision
// reference; shapes that exercise vector tails, several column blocks (m > 2048) and the
// Eigen path (r > 16); NaN/Inf found wherever they sit (by the scan and by the first product); and Finish bit-identical across the
// copies, so ranks on different CPUs agree exactly.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/core/errors.h"
#include "compression/power_sgd_math.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace testing {
namespace {

using compression::internal::CpuKernels;
using compression::internal::MakeCpuBackend;
using compression::internal::MathBackend;

std::vector<CpuKernels> RunnableKernels() {
  std::vector<CpuKernels> out = {CpuKernels::kBaseline};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) out.push_back(CpuKernels::kAvx2);
#endif
  return out;
}

std::string Name(CpuKernels k) { return k == CpuKernels::kAvx2 ? "avx2" : "baseline"; }

std::vector<float> Random(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = static_cast<float>(static_cast<double>(seed >> 40) / 8388608.0 - 1.0);  // [-1, 1)
  }
  return v;
}

struct Shape {
  int64_t n, m;
  int r;
};

// Vector tails (m, n not multiples of 4 or 8), one element, several column blocks, r = 1..4,
// 16 (the largest streamed rank) and 17 (Eigen's GEMM).
const Shape kShapes[] = {{1, 1, 1},  {3, 5, 1},   {7, 13, 2},  {17, 31, 3}, {64, 100, 2},
                         {5, 4100, 2}, {33, 9, 4}, {40, 24, 16}, {20, 40, 17}, {512, 64, 2}};

// ref = A (rows x inner) times B (inner x cols), all row-major, in double.
std::vector<double> Product(const std::vector<double>& a, const std::vector<double>& b, int64_t rows, int64_t inner,
                            int64_t cols) {
  std::vector<double> out(rows * cols, 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < inner; ++k)
      for (int64_t j = 0; j < cols; ++j) out[i * cols + j] += a[i * inner + k] * b[k * cols + j];
  return out;
}

std::vector<double> Wide(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

std::vector<double> Transposed(const std::vector<double>& a, int64_t rows, int64_t cols) {
  std::vector<double> t(a.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  return t;
}

// |got - want| within float rounding of a sum of `terms` products of magnitude <= scale.
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, int64_t terms, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tol = 1e-6 * static_cast<double>(terms) + 1e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol) << what << " at element " << i;
  }
}

class CpuMathTest : public ::testing::TestWithParam<CpuKernels> {
 protected:
  std::unique_ptr<MathBackend> backend_ = MakeCpuBackend(GetParam());
};

TEST_P(CpuMathTest, ProductsMatchReference) {
  for (const Shape& s : kShapes) {
    const std::string what = Name(GetParam()) + " n=" + std::to_string(s.n) + " m=" + std::to_string(s.m) +
                             " r=" + std::to_string(s.r);
    const std::vector<float> g = Random(s.n * s.m, 1), e = Random(s.n * s.m, 2), q = Random(s.m * s.r, 3),
                             p_in = Random(s.n * s.r, 4);
    std::vector<double> m_ref(s.n * s.m);
    for (size_t i = 0; i < m_ref.size(); ++i) m_ref[i] = static_cast<double>(g[i] + e[i]);  // M is formed in float

    // P = G Q and P = (G + E) Q.
    std::vector<float> p(s.n * s.r, 99.0f);
    backend_->MultiplyMQ(g.data(), nullptr, q.data(), p.data(), s.n, s.m, s.r, nullptr);
    ExpectNear(p, Product(Wide(g), Wide(q), s.n, s.m, s.r), s.m, what + " P = G Q");
    std::fill(p.begin(), p.end(), 99.0f);
    bool finite = false;
    backend_->MultiplyMQ(g.data(), e.data(), q.data(), p.data(), s.n, s.m, s.r, &finite);
    ExpectNear(p, Product(m_ref, Wide(q), s.n, s.m, s.r), 2 * s.m, what + " P = (G + E) Q");
    EXPECT_TRUE(finite) << what;
    // The scan in the product sees a NaN or Inf of G wherever it is (first, last, middle).
    for (size_t pos : {size_t{0}, g.size() / 2, g.size() - 1}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
        std::vector<float> g_bad = g;
        g_bad[pos] = bad;
        finite = true;
        backend_->MultiplyMQ(g_bad.data(), e.data(), q.data(), p.data(), s.n, s.m, s.r, &finite);
        EXPECT_FALSE(finite) << what << " value " << bad << " at " << pos;
      }
    }

    // Q = M^T P, with M read only, and with G + E written back into G.
    std::vector<float> q_out(s.m * s.r, 99.0f);
    std::vector<float> g1 = g;
    backend_->MultiplyMtP(g1.data(), nullptr, p_in.data(), q_out.data(), s.n, s.m, s.r);
    ASSERT_EQ(g1, g) << what << " G changed without an error term";
    ExpectNear(q_out, Product(Transposed(Wide(g), s.n, s.m), Wide(p_in), s.m, s.n, s.r), s.n, what + " Q = G^T P");
    std::vector<float> g2 = g;
    std::fill(q_out.begin(), q_out.end(), 99.0f);
    backend_->MultiplyMtP(g2.data(), e.data(), p_in.data(), q_out.data(), s.n, s.m, s.r);
    for (size_t i = 0; i < g2.size(); ++i) ASSERT_EQ(g2[i], g[i] + e[i]) << what << " G + E at " << i;
    ExpectNear(q_out, Product(Transposed(m_ref, s.n, s.m), Wide(p_in), s.m, s.n, s.r), 2 * s.n,
               what + " Q = (G + E)^T P");
  }
}

TEST_P(CpuMathTest, FinishWritesOutAndErrorOfTheSameM) {
  for (const Shape& s : kShapes) {
    const std::string what = Name(GetParam()) + " n=" + std::to_string(s.n) + " m=" + std::to_string(s.m);
    const std::vector<float> m0 = Random(s.n * s.m, 5), p = Random(s.n * s.r, 6), q = Random(s.m * s.r, 7);
    std::vector<float> m = m0, error(s.n * s.m, 99.0f);
    backend_->Finish(m.data(), p.data(), q.data(), s.n, s.m, s.r, error.data(),
                     Buffer{m.data(), m.size(), DType::kFloat32, Device::CPU()});
    ExpectNear(m, Product(Wide(p), Transposed(Wide(q), s.m, s.r), s.n, s.r, s.m), s.r, what + " out = P Q^T");
    for (size_t i = 0; i < m.size(); ++i) ASSERT_EQ(error[i], m0[i] - m[i]) << what << " error = M - out at " << i;
    // Without error feedback only M changes, to the same values.
    std::vector<float> m2 = m0;
    backend_->Finish(m2.data(), p.data(), q.data(), s.n, s.m, s.r, nullptr,
                     Buffer{m2.data(), m2.size(), DType::kFloat32, Device::CPU()});
    ASSERT_EQ(0, std::memcmp(m2.data(), m.data(), m.size() * sizeof(float))) << what;
  }
}

TEST_P(CpuMathTest, LoadMatrixAddsTheErrorInPlace) {
  std::vector<float> g = Random(1003, 8);
  const std::vector<float> g0 = g, e = Random(1003, 9);
  float* M = backend_->LoadMatrix(Buffer{g.data(), g.size(), DType::kFloat32, Device::CPU()}, e.data(), nullptr);
  ASSERT_EQ(M, g.data());
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], g0[i] + e[i]) << i;
}

TEST_P(CpuMathTest, AllFiniteFindsNanAndInfAnywhere) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{31}, size_t{1000}}) {
    std::vector<float> v = Random(n, 10);
    v.insert(v.end(), 1, std::numeric_limits<float>::max());  // large but finite
    EXPECT_TRUE(backend_->AllFinite(Buffer{v.data(), v.size(), DType::kFloat32, Device::CPU()})) << n;
    for (size_t pos = 0; pos < v.size(); pos += (v.size() > 40 ? 97 : 1)) {
      for (float b : bad) {
        std::vector<float> w = v;
        w[pos] = b;
        EXPECT_FALSE(backend_->AllFinite(Buffer{w.data(), w.size(), DType::kFloat32, Device::CPU()}))
            << Name(GetParam()) << " n=" << w.size() << " value " << b << " at " << pos;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, CpuMathTest, ::testing::ValuesIn(RunnableKernels()),
                         [](const ::testing::TestParamInfo<CpuKernels>& info) { return Name(info.param); });

TEST(CpuKernelsTest, FinishIsBitIdenticalAcrossCopies) {
  const std::vector<CpuKernels> kernels = RunnableKernels();
  if (kernels.size() < 2) GTEST_SKIP() << "this CPU has no AVX2: only the baseline kernels run here";
  for (const Shape& s : kShapes) {
    const std::vector<float> m0 = Random(s.n * s.m, 11), p = Random(s.n * s.r, 12), q = Random(s.m * s.r, 13);
    std::vector<std::vector<float>> outs, errors;
    for (CpuKernels k : kernels) {
      std::vector<float> m = m0, error(m0.size());
      MakeCpuBackend(k)->Finish(m.data(), p.data(), q.data(), s.n, s.m, s.r, error.data(),
                                Buffer{m.data(), m.size(), DType::kFloat32, Device::CPU()});
      outs.push_back(m);
      errors.push_back(error);
    }
    EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float))) << s.n << "x" << s.m;
    EXPECT_EQ(0, std::memcmp(errors[0].data(), errors[1].data(), errors[0].size() * sizeof(float)));
  }
}

TEST(CpuKernelsTest, EnvironmentVariableChoosesTheCopyAndRejectsOtherValues) {
  setenv("GOSSIPCC_POWERSGD_CPU_KERNELS", "baseline", 1);
  EXPECT_STREQ(compression::internal::CpuKernelsName(), "Baseline");
  setenv("GOSSIPCC_POWERSGD_CPU_KERNELS", "sse9", 1);
  try {
    compression::internal::CpuKernelsName();
    ADD_FAILURE() << "GOSSIPCC_POWERSGD_CPU_KERNELS=sse9 was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("sse9"), std::string::npos) << e.what();
  }
  unsetenv("GOSSIPCC_POWERSGD_CPU_KERNELS");
  EXPECT_STREQ(compression::internal::CpuKernelsName(CpuKernels::kBaseline), "Baseline");
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
