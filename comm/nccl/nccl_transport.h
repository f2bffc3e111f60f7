// CUDA buffers: collectives and point-to-point through NCCL.
//
// One NCCL communicator per gossipcc Communicator and CUDA device; its unique id is
// published by rank 0 through the store. Every operation runs on a dedicated
// communication stream that first waits for the caller's stream (a StreamPoint recorded when
// the operation was issued, CallOptions::cuda_stream), and its completion is an event on the
// communication stream: the Work is done when that event is. Waiting polls the event and NCCL's asynchronous error state, and
// aborts the NCCL communicator when the deadline passes, so a wait never hangs.
//
// Compiled only when the CUDA toolkit is present (GOSSIPCC_WITH_CUDA); otherwise Create
// throws InvalidArgumentError("built without CUDA").
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/core/p2p_op.h"
#include "comm/core/store.h"
#include "comm/core/work.h"

namespace gossipcc {

// A point in a caller's CUDA stream: an event recorded there when a collective was issued.
// The collective runs after it, so it sees the work queued on that stream before the call and
// none queued after (CallOptions::cuda_stream, comm/core/call_options.h).
class StreamPoint {
 public:
  // Records on `stream` (a cudaStream_t of `device`; nullptr: the legacy default stream).
  // Throws CommError naming `where` if CUDA refuses, InvalidArgumentError without CUDA.
  static std::shared_ptr<StreamPoint> Record(int device, void* stream, const std::string& where);
  ~StreamPoint();
  StreamPoint(const StreamPoint&) = delete;
  StreamPoint& operator=(const StreamPoint&) = delete;
  void* event() const { return event_; }  // a cudaEvent_t

 private:
  explicit StreamPoint(void* event) : event_(event) {}
  void* event_;
};

class NcclTransport {
 public:
  virtual ~NcclTransport() = default;

  // Collective: every rank calls it. Throws if CUDA/NCCL is unavailable or init fails.
  static std::unique_ptr<NcclTransport> Create(std::shared_ptr<Store> store, int rank, int size, int device,
                                               std::chrono::milliseconds timeout);
  // Number of CUDA devices visible to this process (0 without CUDA or without a driver).
  static int DeviceCount();
  // Whether this build has CUDA and NCCL (GOSSIPCC_WITH_CUDA).
  static bool BuiltWithCuda();

  // Each enqueues on the communication stream and returns a Work tied to its completion event.
  virtual std::shared_ptr<Work> Allreduce(Buffer data, ReduceOp op, std::string description) = 0;
  virtual std::shared_ptr<Work> Broadcast(Buffer data, int root, std::string description) = 0;
  virtual std::shared_ptr<Work> Allgather(Buffer input, Buffer output, std::string description) = 0;
  virtual std::shared_ptr<Work> Allgatherv(Buffer input, Buffer output, const std::vector<size_t>& counts,
                                           std::string description) = 0;
  virtual std::shared_ptr<Work> ReduceScatter(Buffer input, Buffer output, ReduceOp op,
                                              std::string description) = 0;
  // Alltoall(v) and grouped p2p: NCCL sends and receives fused in one ncclGroupStart/End.
  virtual std::shared_ptr<Work> Alltoallv(Buffer input, const std::vector<size_t>& send_counts, Buffer output,
                                          const std::vector<size_t>& recv_counts, std::string description) = 0;
  virtual std::shared_ptr<Work> P2P(absl::Span<const P2POp> ops, std::string description) = 0;
  virtual std::shared_ptr<Work> Barrier(std::string description) = 0;
  // The next launch (by the next call above) waits for `point` on the communication stream
  // instead of for the legacy default stream. Call it under the same lock as that launch.
  virtual void FollowNext(std::shared_ptr<StreamPoint> point) = 0;
  virtual int device() const = 0;
};

}  // namespace gossipcc
