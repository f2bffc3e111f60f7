// CUDA buffers through NCCL. Multi-rank cases need one GPU per rank (NCCL refuses two
// ranks on one GPU); each case skips, saying why, when the machine has fewer.
#include "comm/communicator.h"
#include "comm/errors.h"
#include "comm/nccl_transport.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

#if GOSSIPCC_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace gossipcc {
namespace testing {
namespace {

// Empty when `n` GPUs are usable; otherwise why not.
std::string MissingGpus(int n) {
#if !GOSSIPCC_WITH_CUDA
  return "built without CUDA (no /usr/local/cuda at build time)";
#endif
  const int have = NcclTransport::DeviceCount();
  if (have >= n) return "";
  return "needs " + std::to_string(n) + " CUDA device(s), one per rank (NCCL refuses two ranks on one GPU); " +
         std::to_string(have) + " visible";
}

#define REQUIRE_GPUS(n)                                      \
  if (const std::string why = MissingGpus(n); !why.empty()) { \
    GTEST_SKIP() << why;                                     \
  }

#if GOSSIPCC_WITH_CUDA
void RunOnGpus(int n) {
  RunRanks(n, LaunchMode::kProcesses, [](Communicator& comm) {
    const int n = comm.size();
    const size_t count = 1 << 20;
    float* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, count * sizeof(float)), cudaSuccess);
    std::vector<float> host(count, static_cast<float>(comm.rank() + 1));
    cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    Buffer b{dev, count, DType::kFloat32, Device::CUDA(comm.rank())};
    comm.allreduce(b, ReduceOp::kSum)->wait();
    cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost);
    EXPECT_EQ(host[0], n * (n + 1) / 2.0f);
    EXPECT_EQ(host[count - 1], n * (n + 1) / 2.0f);
    comm.broadcast(b, 0)->wait();
    comm.barrier()->wait();
    cudaFree(dev);
  });
}
#endif

TEST(NcclTest, SingleRankAllreduceOnOneGpu) {
  REQUIRE_GPUS(1);
#if GOSSIPCC_WITH_CUDA
  RunOnGpus(1);
#endif
}

TEST(NcclTest, TwoRanksOnTwoGpus) {
  REQUIRE_GPUS(2);
#if GOSSIPCC_WITH_CUDA
  RunOnGpus(2);
#endif
}

TEST(NcclTest, CudaBufferWithoutADeviceIsRejectedClearly) {
  if (NcclTransport::DeviceCount() > 0) GTEST_SKIP() << "a GPU is present: this case covers machines without one";
  auto comm = Communicator::Create(MakeHashStore(), 0, 1);
  std::vector<float> host(4);
  try {
    comm->allreduce(Buffer{host.data(), 4, DType::kFloat32, Device::CUDA(0)});
    ADD_FAILURE() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("0 CUDA device(s) are visible"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
