// Gossip collectives on CUDA buffers (staged through host memory, so several ranks may share
// one GPU). Needs a GPU; without one each case skips and says why. The last case covers
// machines without a GPU: a CUDA buffer is refused with a clear error, nothing hangs.
#include <cstdio>
#include <string>
#include <vector>

#include "algorithms/elastic_averaging.h"
#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "algorithms/symmetric_gossip.h"
#include "comm/core/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/cuda_devices.h"
#include "tests/comm/harness.h"

#if GOSSIPCC_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace gossipcc {
namespace testing {
namespace {

// The ranks are threads sharing device 0 (the gossip stages CUDA buffers through host memory).
std::string MissingGpu() {
  if (!MissingGpus(1).empty() && VisibleCudaDevices() == 0) {
#if !GOSSIPCC_WITH_CUDA
    return "built without CUDA (no CUDA toolkit with NCCL at build time)";
#else
    return "needs a CUDA device; none visible";
#endif
  }
  return "";
}

TEST(GossipCudaTest, PushSumAndDpsgdOnCudaBuffersMatchCpu) {
  if (const std::string why = MissingGpu(); !why.empty()) GTEST_SKIP() << why;
#if GOSSIPCC_WITH_CUDA
  RunRanks(4, LaunchMode::kThreads, [](Communicator& comm) {
    const size_t count = 1000;
    std::vector<float> host(count), cpu(count);
    for (size_t i = 0; i < count; ++i) host[i] = cpu[i] = static_cast<float>(comm.rank() * 3 + i % 7);
    float* dev = nullptr;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dev, count * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    std::shared_ptr<const PeerGraph> g = MakePeerGraph("exponential", 4);
    PushSum on_gpu(g), on_cpu(g);
    for (int k = 0; k < 2; ++k) {
      on_gpu.Step(comm, {Buffer{dev, count, DType::kFloat32, Device::CUDA(0)}});
      on_cpu.Step(comm, {CpuBuffer(cpu.data(), count)});
    }
    SymmetricGossip sg_gpu(MakePeerGraph("ring", 4)), sg_cpu(MakePeerGraph("ring", 4));
    sg_gpu.Step(comm, {Buffer{dev, count, DType::kFloat32, Device::CUDA(0)}});
    sg_cpu.Step(comm, {CpuBuffer(cpu.data(), count)});
    ASSERT_EQ(cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dev);
    EXPECT_EQ(host, cpu);
    EXPECT_EQ(on_gpu.weight(), on_cpu.weight());
  });
#endif
}

TEST(GossipCudaTest, CudaBufferWithoutGpuIsRefused) {
  if (VisibleCudaDevices() > 0) GTEST_SKIP() << "a GPU is present: this case covers machines without one";
  RunRanks(2, LaunchMode::kThreads, [](Communicator& comm) {
    std::vector<float> fake(4);
    PushSum ps(MakePeerGraph("exponential", 2));
    try {
      ps.Step(comm, {Buffer{fake.data(), 4, DType::kFloat32, Device::CUDA(0)}});
      ADD_FAILURE() << "expected InvalidArgumentError";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(e.what(), ::testing::AnyOf(::testing::HasSubstr("without CUDA"), ::testing::HasSubstr("cuda")));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("push_sum"));
    }
    EXPECT_EQ(ps.step(), 0);
  });
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
