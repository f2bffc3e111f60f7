// The CUDA path (cuBLAS GEMMs, Gram-Schmidt through cuBLAS, our conversion and NaN/Inf kernels)
// against the CPU path on the same inputs. Needs one GPU per rank (NCCL refuses two ranks on
// one GPU); each case skips, saying why, on machines with fewer.
#include <cmath>
#include <vector>

#include "comm/communicator.h"
#include "comm/core/reduce.h"
#include "compression/power_sgd.h"
#include "gtest/gtest.h"
#include "tests/comm/cuda_devices.h"
#include "tests/comm/harness.h"

#if GOSSIPCC_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace gossipcc {
namespace testing {
namespace {

using compression::GradientTensor;
using compression::PowerSGD;
using compression::PowerSGDOptions;

#if GOSSIPCC_WITH_CUDA
// Runs 3 steps of rank-2 PowerSGD on float32 and float16 tensors twice, from host memory and
// from device memory, and compares the results.
void CompareCudaWithCpu(Communicator& comm) {
  const int me = comm.rank();
  const std::vector<std::vector<int64_t>> shapes = {{40, 12}, {16, 4, 3, 3}, {12, 40}, {17}};
  PowerSGDOptions o;
  o.matrix_approximation_rank = 2;
  o.start_powerSGD_iter = 1;
  PowerSGD on_cpu(o), on_gpu(o);
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> host;
    std::vector<std::vector<uint16_t>> half;
    for (size_t t = 0; t < shapes.size(); ++t) {
      int64_t n = 1;
      for (int64_t d : shapes[t]) n *= d;
      std::vector<float> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * i + 1.3f * t + 0.7f * step + 0.11f * me);
      std::vector<uint16_t> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = FloatToHalf(v[i]);
      host.push_back(std::move(v));
      half.push_back(std::move(h));
    }
    std::vector<void*> dev;
    std::vector<GradientTensor> cpu_list, gpu_list;
    for (size_t t = 0; t < shapes.size(); ++t) {
      const size_t n = host[t].size();
      void* f = nullptr;
      void* h = nullptr;
      ASSERT_EQ(cudaMalloc(&f, n * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&h, n * 2), cudaSuccess);
      cudaMemcpy(f, host[t].data(), n * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(h, half[t].data(), n * 2, cudaMemcpyHostToDevice);
      dev.push_back(f);
      dev.push_back(h);
      const std::string key = "t" + std::to_string(t);
      cpu_list.push_back({key, CpuBuffer(host[t].data(), n), shapes[t]});
      cpu_list.push_back({key + "h", Buffer{half[t].data(), n, DType::kFloat16, Device::CPU()}, shapes[t]});
      gpu_list.push_back({key, Buffer{f, n, DType::kFloat32, Device::CUDA(me)}, shapes[t]});
      gpu_list.push_back({key + "h", Buffer{h, n, DType::kFloat16, Device::CUDA(me)}, shapes[t]});
    }
    const auto cs = on_cpu.AllReduce(comm, cpu_list);
    const auto gs = on_gpu.AllReduce(comm, gpu_list);
    EXPECT_EQ(cs.compressed_tensors, gs.compressed_tensors);
    EXPECT_EQ(cs.bytes_after, gs.bytes_after);
    for (size_t t = 0; t < shapes.size(); ++t) {
      const size_t n = host[t].size();
      std::vector<float> f(n);
      std::vector<uint16_t> h(n);
      cudaMemcpy(f.data(), dev[2 * t], n * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(h.data(), dev[2 * t + 1], n * 2, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(f[i], host[t][i], 2e-3 * (1 + std::abs(host[t][i]))) << "step " << step << " tensor " << t << " elem " << i;
        ASSERT_NEAR(HalfToFloat(h[i]), HalfToFloat(half[t][i]), 1e-2 * (1 + std::abs(HalfToFloat(half[t][i]))))
            << "fp16 step " << step << " tensor " << t << " elem " << i;
      }
    }
    for (void* p : dev) cudaFree(p);
  }
  // The state comes back to the host for checkpoints.
  compression::PowerSGDTensorState st;
  ASSERT_TRUE(on_gpu.GetTensorState("t0", &st));
  EXPECT_EQ(st.q.size(), 12u * 2);
  EXPECT_EQ(st.error.size(), 40u * 12);
}
#endif

TEST(PowerSGDCudaTest, OneRankOnOneGpuMatchesCpu) {
  if (const std::string why = MissingGpus(1); !why.empty()) GTEST_SKIP() << why;
#if GOSSIPCC_WITH_CUDA
  RunRanks(1, LaunchMode::kProcesses, CompareCudaWithCpu);
#endif
}

TEST(PowerSGDCudaTest, TwoRanksOnTwoGpusMatchCpu) {
  if (const std::string why = MissingGpus(2); !why.empty()) GTEST_SKIP() << why;
#if GOSSIPCC_WITH_CUDA
  RunRanks(2, LaunchMode::kProcesses, CompareCudaWithCpu);
#endif
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
