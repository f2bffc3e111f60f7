// CUDA buffers through NCCL: every collective the Communicator offers on CUDA memory, at n = 1
// up to the number of GPUs on the machine (one GPU per rank, each rank a process: NCCL refuses
// two ranks on one GPU), every dtype, sizes from 0 to 16 MB, each result checked against a
// reference computed on the CPU from every rank's known input. A case that needs more GPUs
// than the machine has skips and says so; without CUDA every GPU case skips with the reason.
#include <cmath>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/cuda_support.h"
#include "comm/core/errors.h"
#include "comm/nccl/nccl_transport.h"
#include "gtest/gtest.h"
#include "tests/comm/cuda_devices.h"
#include "tests/comm/harness.h"
#include "tests/comm/typed_array.h"

#if GOSSIPCC_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace gossipcc {
namespace testing {
namespace {

#define REQUIRE_GPUS(n)                                       \
  if (const std::string why = MissingGpus(n); !why.empty()) { \
    GTEST_SKIP() << why;                                      \
  }

const DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                            DType::kInt8,    DType::kUInt8,   DType::kInt32,   DType::kInt64};

// Small non-negative integers: sums over 8 ranks, minima and maxima are exact in every dtype.
double Value(int rank, size_t i) { return static_cast<double>((rank * 7 + i * 3) % 11); }
// Factors 1 or 2: a product over 8 ranks is at most 256, exact in every dtype but the 8-bit ones.
double Factor(int rank, size_t i) { return 1.0 + static_cast<double>((rank + i) % 2); }

#if GOSSIPCC_WITH_CUDA

// A device copy of a TypedArray; copies back on Read().
class DeviceArray {
 public:
  explicit DeviceArray(const TypedArray& host) : host_(host) {
    const size_t bytes = host.size() * ElementSize(host.dtype());
    EXPECT_EQ(cudaMalloc(&dev_, bytes + 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dev_, host.raw().data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(dev_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  Buffer buffer(int device) const { return Buffer{dev_, host_.size(), host_.dtype(), Device::CUDA(device)}; }
  TypedArray Read() const {
    TypedArray out(host_.dtype(), host_.size());
    EXPECT_EQ(cudaMemcpy(out.buffer().data, dev_, host_.size() * ElementSize(host_.dtype()), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  TypedArray host_;
  void* dev_ = nullptr;
};

TypedArray Filled(DType dtype, size_t count, const std::function<double(size_t)>& f) {
  TypedArray a(dtype, count);
  for (size_t i = 0; i < count; ++i) a.set(i, f(i));
  return a;
}

// Fails naming the collective, the dtype and the first element that differs from `want(i)`.
void ExpectValues(const TypedArray& got, const std::function<double(size_t)>& want, double tolerance,
                  const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want(i);
    ASSERT_LE(std::abs(got.get(i) - w), tolerance * (1 + std::abs(w)))
        << what << " (" << DTypeName(got.dtype()) << ", " << got.size() << " elements): element " << i << " is "
        << got.get(i) << ", want " << w;
  }
}

// The reference of an all-reduce over n ranks of Value() (or Factor() for kProduct).
double Reduced(ReduceOp op, int n, size_t i) {
  double acc = op == ReduceOp::kProduct ? Factor(0, i) : Value(0, i);
  for (int r = 1; r < n; ++r) {
    const double v = op == ReduceOp::kProduct ? Factor(r, i) : Value(r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProduct: acc *= v; break;
    }
  }
  return op == ReduceOp::kAvg ? acc / n : acc;
}

void AllreduceEveryDTypeAndOp(Communicator& comm, int dev) {
  const int n = comm.size(), me = comm.rank();
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) continue;  // rejected: tested on CPU
      if (op == ReduceOp::kProduct && (dtype == DType::kInt8 || dtype == DType::kUInt8)) continue;  // overflows
      for (size_t count : {size_t{0}, size_t{1}, size_t{1031}}) {
        DeviceArray d(Filled(dtype, count, [&](size_t i) { return op == ReduceOp::kProduct ? Factor(me, i) : Value(me, i); }));
        comm.allreduce(d.buffer(dev), op)->wait();
        const double tolerance = op != ReduceOp::kAvg ? 0 : IsHalfPrecision(dtype) ? 1e-2 : 1e-6;
        ASSERT_NO_FATAL_FAILURE(ExpectValues(d.Read(), [&](size_t i) { return Reduced(op, n, i); }, tolerance,
                                             std::string("allreduce ") + ReduceOpName(op)));
      }
    }
  }
  // 16 MB of float32 (4M elements): NCCL's large-message path.
  const size_t big = size_t{4} << 20;
  DeviceArray d(Filled(DType::kFloat32, big, [&](size_t i) { return Value(me, i); }));
  comm.allreduce(d.buffer(dev))->wait();
  ASSERT_NO_FATAL_FAILURE(ExpectValues(d.Read(), [&](size_t i) { return Reduced(ReduceOp::kSum, n, i); }, 0,
                                       "allreduce sum, 16 MB"));
}

void DataMovementCollectives(Communicator& comm, int dev) {
  const int n = comm.size(), me = comm.rank();
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kUInt8}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1031}}) {
      // Broadcast from every root.
      for (int root = 0; root < n; ++root) {
        DeviceArray d(Filled(dtype, count, [&](size_t i) { return Value(me, i); }));
        comm.broadcast(d.buffer(dev), root)->wait();
        ASSERT_NO_FATAL_FAILURE(
            ExpectValues(d.Read(), [&](size_t i) { return Value(root, i); }, 0, "broadcast from " + std::to_string(root)));
      }
      // All-gather: rank r's block at r * count.
      DeviceArray in(Filled(dtype, count, [&](size_t i) { return Value(me, i); }));
      DeviceArray out(Filled(dtype, count * n, [](size_t) { return 0; }));
      comm.allgather(in.buffer(dev), out.buffer(dev))->wait();
      ASSERT_NO_FATAL_FAILURE(ExpectValues(
          out.Read(), [&](size_t i) { return Value(static_cast<int>(i / count), i % count); }, 0, "allgather"));
      // Reduce-scatter: rank r gets the sum over ranks of chunk r.
      DeviceArray rs_in(Filled(dtype, count * n, [&](size_t i) { return Value(me, i); }));
      DeviceArray rs_out(Filled(dtype, count, [](size_t) { return 0; }));
      comm.reduce_scatter(rs_in.buffer(dev), rs_out.buffer(dev), ReduceOp::kSum)->wait();
      ASSERT_NO_FATAL_FAILURE(ExpectValues(
          rs_out.Read(), [&](size_t i) { return Reduced(ReduceOp::kSum, n, me * count + i); }, 0, "reduce_scatter"));
      // All-to-all: chunk j of rank i's input lands as chunk i of rank j's output.
      DeviceArray a_in(Filled(dtype, count * n, [&](size_t i) { return Value(me, i); }));
      DeviceArray a_out(Filled(dtype, count * n, [](size_t) { return 0; }));
      comm.alltoall(a_in.buffer(dev), a_out.buffer(dev))->wait();
      ASSERT_NO_FATAL_FAILURE(ExpectValues(
          a_out.Read(), [&](size_t i) { return Value(static_cast<int>(i / count), me * count + i % count); }, 0,
          "alltoall"));
    }
    // Uneven: rank r contributes r + 2 elements (all-gatherv); rank i sends i + j + 1 to rank j.
    std::vector<size_t> counts(n);
    size_t total = 0;
    for (int r = 0; r < n; ++r) total += counts[r] = r + 2;
    DeviceArray v_in(Filled(dtype, counts[me], [&](size_t i) { return Value(me, i); }));
    DeviceArray v_out(Filled(dtype, total, [](size_t) { return 0; }));
    comm.allgatherv(v_in.buffer(dev), v_out.buffer(dev), counts)->wait();
    std::vector<std::pair<int, size_t>> origin;  // (rank, index) of each output element
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < counts[r]; ++i) origin.push_back({r, i});
    ASSERT_NO_FATAL_FAILURE(ExpectValues(
        v_out.Read(), [&](size_t k) { return Value(origin[k].first, origin[k].second); }, 0, "allgatherv"));
    std::vector<size_t> send(n), recv(n);
    size_t send_total = 0, recv_total = 0;
    for (int j = 0; j < n; ++j) send_total += send[j] = me + j + 1;
    for (int i = 0; i < n; ++i) recv_total += recv[i] = i + me + 1;
    // Element k of the block for rank j carries Value(me, 100 * j + k).
    std::vector<std::pair<int, size_t>> sent;
    for (int j = 0; j < n; ++j)
      for (size_t k = 0; k < send[j]; ++k) sent.push_back({j, k});
    DeviceArray t_in(Filled(dtype, send_total, [&](size_t e) { return Value(me, 100 * sent[e].first + sent[e].second); }));
    DeviceArray t_out(Filled(dtype, recv_total, [](size_t) { return 0; }));
    comm.alltoallv(t_in.buffer(dev), send, t_out.buffer(dev), recv)->wait();
    std::vector<std::pair<int, size_t>> received;
    for (int i = 0; i < n; ++i)
      for (size_t k = 0; k < recv[i]; ++k) received.push_back({i, k});
    ASSERT_NO_FATAL_FAILURE(ExpectValues(
        t_out.Read(), [&](size_t e) { return Value(received[e].first, 100 * me + received[e].second); }, 0,
        "alltoallv"));
  }
  comm.barrier()->wait();
  if (n == 1) return;  // point to point needs a peer
  // Point to point around the ring: send to the next, receive from the previous.
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  DeviceArray s(Filled(DType::kFloat32, 4099, [&](size_t i) { return Value(me, i); }));
  DeviceArray r(Filled(DType::kFloat32, 4099, [](size_t) { return 0; }));
  const P2POp ops[] = {P2POp::Send(s.buffer(dev), next), P2POp::Recv(r.buffer(dev), prev)};
  comm.p2p(ops)->wait();
  ASSERT_NO_FATAL_FAILURE(ExpectValues(r.Read(), [&](size_t i) { return Value(prev, i); }, 0, "p2p ring"));
}

void EveryCollectiveOnGpus(Communicator& comm) {
  const int dev = comm.rank();  // one GPU per rank
  ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(AllreduceEveryDTypeAndOp(comm, dev));
  ASSERT_NO_FATAL_FAILURE(DataMovementCollectives(comm, dev));
}

// A collective follows the caller's stream (CallOptions::cuda_stream): its input,
// written by a copy still running on a non-blocking stream when the collective is issued, is
// read only after that copy. The copy (256 MB from pinned memory, milliseconds) outlasts the
// launch by far, so a collective that did not wait for it would gather zeros.
void FollowsTheCallersStream(Communicator& comm) {
  const int dev = comm.rank(), n = comm.size();
  ASSERT_EQ(cudaSetDevice(dev), cudaSuccess);
  const size_t count = size_t{64} << 20;
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, count * sizeof(float)), cudaSuccess);
  for (size_t i = 0; i < count; ++i) pinned[i] = static_cast<float>(Value(comm.rank(), i));
  float *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, n * count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(in, 0, count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(out, 0, n * count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The NCCL communicator is created by the first CUDA collective (hundreds of milliseconds):
  // not this one, whose launch must come while the copy still runs.
  comm.allgather(Buffer{in, 1, DType::kFloat32, Device::CUDA(dev)}, Buffer{out, size_t(n), DType::kFloat32, Device::CUDA(dev)})
      ->wait();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(in, pinned, count * sizeof(float), cudaMemcpyHostToDevice, stream), cudaSuccess);
  CallOptions call;
  call.cuda_stream = stream;
  std::shared_ptr<Work> work = comm.allgather(Buffer{in, count, DType::kFloat32, Device::CUDA(dev)},
                                              Buffer{out, n * count, DType::kFloat32, Device::CUDA(dev)}, call);
  work->wait();
  std::vector<float> got(n * count);
  ASSERT_EQ(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t k = 0; k < got.size(); ++k) {
    const float want = static_cast<float>(Value(static_cast<int>(k / count), k % count));
    ASSERT_EQ(got[k], want) << "element " << k << " of the gathered output: the collective read its input before "
                            << "the copy queued on the caller's stream had finished";
  }
  cudaStreamDestroy(stream);
  cudaFree(in);
  cudaFree(out);
  cudaFreeHost(pinned);
}

#endif  // GOSSIPCC_WITH_CUDA

TEST(NcclStreamTest, CollectiveFollowsTheIssuingThreadsCurrentStream) {
  REQUIRE_GPUS(1);
#if GOSSIPCC_WITH_CUDA
  RunRanks(1, LaunchMode::kProcesses, FollowsTheCallersStream, {}, std::chrono::minutes(5));
#endif
}

class NcclCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclCollectivesTest, EveryCollectiveMatchesCpuReference) {
  const int n = GetParam();
  REQUIRE_GPUS(n);
#if GOSSIPCC_WITH_CUDA
  RunRanks(n, LaunchMode::kProcesses, EveryCollectiveOnGpus, {}, std::chrono::minutes(10));
#endif
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclCollectivesTest, ::testing::Range(1, 9),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

// Machines without a GPU: a CUDA buffer is refused with an error that says why, nothing hangs.
TEST(NcclTest, CudaBufferWithoutADeviceIsRejectedClearly) {
  if (VisibleCudaDevices() > 0) GTEST_SKIP() << "a GPU is present: this case covers machines without one";
  auto comm = Communicator::Create(MakeHashStore(), 0, 1);
  std::vector<float> host(4);
  try {
    comm->allreduce(Buffer{host.data(), 4, DType::kFloat32, Device::CUDA(0)});
    ADD_FAILURE() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
#if GOSSIPCC_WITH_CUDA
    EXPECT_NE(std::string(e.what()).find("0 CUDA device(s) are visible"), std::string::npos) << e.what();
#else
    EXPECT_NE(std::string(e.what()).find("without CUDA"), std::string::npos) << e.what();
#endif
  }
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
