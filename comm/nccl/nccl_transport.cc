#include "comm/nccl/nccl_transport.h"

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"

#if GOSSIPCC_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <thread>

#include "absl/synchronization/mutex.h"
#endif

namespace gossipcc {

#if !GOSSIPCC_WITH_CUDA

int NcclTransport::DeviceCount() { return 0; }

bool NcclTransport::BuiltWithCuda() { return false; }

std::shared_ptr<StreamPoint> StreamPoint::Record(int device, void*, const std::string& where) {
  throw InvalidArgumentError(absl::StrCat(where, ": CUDA buffer on cuda:", device,
                                          " but gossipcc was built without CUDA (no /usr/local/cuda at build time)"));
}

StreamPoint::~StreamPoint() = default;

std::unique_ptr<NcclTransport> NcclTransport::Create(std::shared_ptr<Store>, int rank, int, int device,
                                                     std::chrono::milliseconds) {
  throw InvalidArgumentError(absl::StrCat("rank ", rank, ": CUDA buffer on cuda:", device,
                                          " but gossipcc was built without CUDA (no /usr/local/cuda at build time)"));
}

#else

namespace {

using Clock = std::chrono::steady_clock;

void CheckCuda(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw CommError(absl::StrCat(what, ": CUDA error: ", cudaGetErrorString(err)));
}

void CheckNccl(ncclResult_t res, const std::string& what) {
  if (res != ncclSuccess && res != ncclInProgress) {
    throw CommError(absl::StrCat(what, ": NCCL error: ", ncclGetErrorString(res)));
  }
}

ncclDataType_t ToNccl(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt8: return ncclInt8;
    case DType::kUInt8: return ncclUint8;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: break;  // refused for CUDA buffers by the argument checks
  }
  return ncclSum;
}

// Completion of one enqueued NCCL operation: an event on the communication stream.
class NcclWork : public Work, public std::enable_shared_from_this<NcclWork> {
 public:
  NcclWork(std::string description, cudaEvent_t done, ncclComm_t comm, std::chrono::milliseconds timeout)
      : description_(std::move(description)), done_(done), comm_(comm), timeout_(timeout) {}
  ~NcclWork() override { cudaEventDestroy(done_); }

  bool is_completed() override {
    absl::MutexLock lock(&mu_);
    return PollLocked();
  }

  void wait(std::chrono::milliseconds timeout) override {
    const auto limit = timeout.count() > 0 ? timeout : timeout_;
    const auto deadline = Clock::now() + limit;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (PollLocked()) {
          if (error_) std::rethrow_exception(error_);
          return;
        }
      }
      if (Clock::now() > deadline) {
        // A collective that has not finished by its deadline never will on its own:
        // abort the communicator so every later call fails fast instead of hanging.
        ncclCommAbort(comm_);
        throw TimeoutError(absl::StrCat(description_, ": did not complete within ", limit.count(),
                                        " ms; the NCCL communicator was aborted"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::exception_ptr exception() override {
    absl::MutexLock lock(&mu_);
    PollLocked();
    return error_;
  }

  void add_done_callback(std::function<void()> fn) override {
    // Runs on a helper thread that waits for the event: callbacks must not block the caller.
    // Holds a reference so the Work outlives the helper thread even if the caller drops it.
    std::thread([self = shared_from_this(), fn = std::move(fn)] {
      try {
        self->wait(std::chrono::milliseconds::zero());
      } catch (...) {
      }
      fn();
    }).detach();
  }

  const std::string& description() const override { return description_; }

 private:
  bool PollLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return true;
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) {
      finished_ = true;
      return true;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      error_ = std::make_exception_ptr(
          PeerError(absl::StrCat(description_, ": NCCL reported ", ncclGetErrorString(async))));
      finished_ = true;
      return true;
    }
    if (q != cudaErrorNotReady) {
      error_ = std::make_exception_ptr(CommError(absl::StrCat(description_, ": CUDA error ", cudaGetErrorString(q))));
      finished_ = true;
      return true;
    }
    return false;
  }

  const std::string description_;
  cudaEvent_t done_;
  ncclComm_t comm_;
  const std::chrono::milliseconds timeout_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::exception_ptr error_ ABSL_GUARDED_BY(mu_);
};

class NcclTransportImpl : public NcclTransport {
 public:
  NcclTransportImpl(ncclComm_t comm, cudaStream_t stream, int device, int rank, int size,
                    std::chrono::milliseconds timeout)
      : comm_(comm), stream_(stream), device_(device), rank_(rank), size_(size), timeout_(timeout) {}

  ~NcclTransportImpl() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int device() const override { return device_; }

  void FollowNext(std::shared_ptr<StreamPoint> point) override { follow_next_ = std::move(point); }

  std::shared_ptr<Work> Allreduce(Buffer data, ReduceOp op, std::string description) override {
    return Launch(std::move(description), [&] {
      return ncclAllReduce(data.data, data.data, data.count, ToNccl(data.dtype), ToNccl(op), comm_, stream_);
    });
  }

  std::shared_ptr<Work> Broadcast(Buffer data, int root, std::string description) override {
    return Launch(std::move(description), [&] {
      return ncclBroadcast(data.data, data.data, data.count, ToNccl(data.dtype), root, comm_, stream_);
    });
  }

  std::shared_ptr<Work> Allgather(Buffer input, Buffer output, std::string description) override {
    return Launch(std::move(description), [&] {
      return ncclAllGather(input.data, output.data, input.count, ToNccl(input.dtype), comm_, stream_);
    });
  }

  std::shared_ptr<Work> Allgatherv(Buffer input, Buffer output, const std::vector<size_t>& counts,
                                   std::string description) override {
    return Launch(std::move(description), [&] {
      const size_t es = ElementSize(output.dtype);
      size_t offset = 0;
      ncclGroupStart();
      for (int r = 0; r < size_; ++r) {
        auto* dst = static_cast<char*>(output.data) + offset * es;
        ncclResult_t res =
            ncclBroadcast(r == rank_ ? input.data : dst, dst, counts[r], ToNccl(output.dtype), r, comm_, stream_);
        if (res != ncclSuccess) {
          ncclGroupEnd();
          return res;
        }
        offset += counts[r];
      }
      return ncclGroupEnd();
    });
  }

  std::shared_ptr<Work> ReduceScatter(Buffer input, Buffer output, ReduceOp op, std::string description) override {
    return Launch(std::move(description), [&] {
      return ncclReduceScatter(input.data, output.data, output.count, ToNccl(input.dtype), ToNccl(op), comm_,
                               stream_);
    });
  }

  std::shared_ptr<Work> Alltoallv(Buffer input, const std::vector<size_t>& send_counts, Buffer output,
                                  const std::vector<size_t>& recv_counts, std::string description) override {
    return Launch(std::move(description), [&] {
      const size_t es = ElementSize(input.dtype);
      size_t in_off = 0, out_off = 0;
      ncclGroupStart();
      for (int r = 0; r < size_; ++r) {
        if (send_counts[r] > 0)
          ncclSend(static_cast<char*>(input.data) + in_off * es, send_counts[r], ToNccl(input.dtype), r, comm_,
                   stream_);
        if (recv_counts[r] > 0)
          ncclRecv(static_cast<char*>(output.data) + out_off * es, recv_counts[r], ToNccl(output.dtype), r, comm_,
                   stream_);
        in_off += send_counts[r];
        out_off += recv_counts[r];
      }
      return ncclGroupEnd();
    });
  }

  std::shared_ptr<Work> P2P(absl::Span<const P2POp> ops, std::string description) override {
    return Launch(std::move(description), [&] {
      ncclGroupStart();
      for (const P2POp& op : ops) {
        if (op.buffer.count == 0) continue;
        if (op.kind == P2POp::Kind::kSend) {
          ncclSend(op.buffer.data, op.buffer.count, ToNccl(op.buffer.dtype), op.peer, comm_, stream_);
        } else {
          ncclRecv(op.buffer.data, op.buffer.count, ToNccl(op.buffer.dtype), op.peer, comm_, stream_);
        }
      }
      return ncclGroupEnd();
    });
  }

  std::shared_ptr<Work> Barrier(std::string description) override {
    if (!barrier_scratch_) CheckCuda(cudaMalloc(&barrier_scratch_, sizeof(float)), "barrier scratch");
    return Launch(std::move(description), [&] {
      return ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

 private:
  template <typename Fn>
  std::shared_ptr<Work> Launch(std::string description, Fn enqueue) {
    CheckCuda(cudaSetDevice(device_), description);
    // The communication stream waits for the caller's stream as it was when the operation was
    // issued (FollowNext), else for everything queued on the legacy default stream until now.
    std::shared_ptr<StreamPoint> point = std::move(follow_next_);
    follow_next_.reset();
    if (!point) point = StreamPoint::Record(device_, nullptr, description);
    CheckCuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(point->event()), 0), description);
    cudaEvent_t done;
    const ncclResult_t res = enqueue();
    CheckNccl(res, description);
    if (res == ncclInProgress) AwaitEnqueued(description);
    CheckCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), description);
    CheckCuda(cudaEventRecord(done, stream_), description);
    return std::make_shared<NcclWork>(std::move(description), done, comm_, timeout_);
  }

  // Non-blocking communicators may still be enqueueing when a call returns ncclInProgress;
  // the completion event must be recorded after the kernels are on the stream.
  void AwaitEnqueued(const std::string& description) {
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t state;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return;
      CheckNccl(state, description);
      if (Clock::now() > deadline) {
        ncclCommAbort(comm_);
        throw TimeoutError(absl::StrCat(description, ": NCCL did not enqueue within ", timeout_.count(), " ms"));
      }
      std::this_thread::yield();
    }
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  const int device_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  void* barrier_scratch_ = nullptr;
  std::shared_ptr<StreamPoint> follow_next_;  // guarded by the caller's launch lock
};

}  // namespace

std::shared_ptr<StreamPoint> StreamPoint::Record(int device, void* stream, const std::string& where) {
  int previous = -1;
  CheckCuda(cudaGetDevice(&previous), where);
  CheckCuda(cudaSetDevice(device), where);
  cudaEvent_t event = nullptr;
  cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
  cudaSetDevice(previous);
  if (err != cudaSuccess) {
    if (event) cudaEventDestroy(event);
    CheckCuda(err, absl::StrCat(where, ": recording the caller's stream"));
  }
  return std::shared_ptr<StreamPoint>(new StreamPoint(event));
}

StreamPoint::~StreamPoint() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

bool NcclTransport::BuiltWithCuda() { return true; }

int NcclTransport::DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<NcclTransport> NcclTransport::Create(std::shared_ptr<Store> store, int rank, int size, int device,
                                                     std::chrono::milliseconds timeout) {
  const std::string where = absl::StrCat("rank ", rank, " of ", size, ": NCCL init on cuda:", device);
  const int devices = DeviceCount();
  if (device < 0 || device >= devices) {
    throw InvalidArgumentError(absl::StrCat(where, ": no such CUDA device (", devices, " visible)"));
  }
  CheckCuda(cudaSetDevice(device), where);
  ncclUniqueId id;
  const std::string key = absl::StrCat("nccl_unique_id/cuda", device);
  if (rank == 0) {
    CheckNccl(ncclGetUniqueId(&id), where);
    store->set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    std::vector<char> bytes = store->get(key, timeout);
    if (bytes.size() != sizeof(id.internal)) throw CommError(absl::StrCat(where, ": malformed NCCL unique id"));
    std::copy(bytes.begin(), bytes.end(), id.internal);
  }
  // Non-blocking init so a missing rank becomes a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm;
  CheckNccl(ncclCommInitRankConfig(&comm, size, id, rank, &config), where);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    ncclResult_t state;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      ncclCommAbort(comm);
      CheckNccl(state, where);
    }
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      throw TimeoutError(absl::StrCat(where, ": not every rank joined within ", timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cudaStream_t stream;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), where);
  return std::make_unique<NcclTransportImpl>(comm, stream, device, rank, size, timeout);
}

#endif  // GOSSIPCC_WITH_CUDA

}  // namespace gossipcc
