// CollectivePlan: what one collective call is, decided on the calling thread from arguments
// already checked (communicator.cc): its description (OpSpec: what every rank must agree on),
// the memory it touches (Footprint, which Lanes schedules by), and how its data moves once the
// signature check passed: the CPU path on Gloo, the CUDA path on NCCL, and, when its payload
// fits EagerCollectiveMaxBytes, the eager plan that completes it inside the check itself.
//
// Every rank derives the same plan from the same call: the choice of path depends only on
// what the ranks must agree on (the signature check compares it), never on this rank's data.
// A plan does nothing until a lane runs it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/core/op_spec.h"
#include "comm/core/types.h"
#include "comm/core/work.h"
#include "comm/gloo/call.h"
#include "comm/lanes.h"

namespace gossipcc {

class CollectiveHandshake;
class NcclTransport;

// How a CPU collective moves its data once the signature check passed (or with it, when
// `checks_itself`), and how a CUDA one launches on NCCL (given the Work's description).
using CpuPath = std::function<void(const GlooCall&)>;
using CudaPath = std::function<std::shared_ptr<Work>(NcclTransport&, std::string)>;

// A CPU collective small enough to travel inside the signature check (consistency_check.h):
// `payload` rides with this rank's header, and `finish` completes the collective from every
// rank's payload, given the lane's handshake and scratch. A null `finish`: not eager.
using EagerFinish = std::function<void(const CollectiveHandshake&, CollectiveScratch&)>;
struct EagerPlan {
  absl::Span<const uint8_t> payload;
  EagerFinish finish;
};

struct CollectivePlan {
  OpSpec spec;  // seq is assigned when the collective is queued
  Footprint footprint;
  CpuPath cpu;
  CudaPath cuda;
  uint64_t payload_bytes = 0;  // this rank's payload, for TrafficCounters
  EagerPlan eager;
  bool checks_itself = false;  // `cpu` runs the signature check itself, overlapped with its first messages
};

// The plans, one per collective, for rank `rank` of `size`. Their arguments satisfy
// ArgumentChecks and the call's own arithmetic (counts that add up, ...).
CollectivePlan PlanAllreduce(int size, Buffer data, ReduceOp op);
CollectivePlan PlanBroadcast(int rank, int size, Buffer data, int root);
CollectivePlan PlanAllgather(int size, Buffer input, Buffer output);
CollectivePlan PlanAllgatherv(int size, Buffer input, Buffer output, std::vector<size_t> counts);
CollectivePlan PlanReduceScatter(int rank, int size, Buffer input, Buffer output, ReduceOp op);
CollectivePlan PlanAlltoall(int size, Buffer input, Buffer output);
CollectivePlan PlanAlltoallv(Buffer input, std::vector<size_t> send_counts, Buffer output,
                             std::vector<size_t> recv_counts);
CollectivePlan PlanBarrier(int size);

}  // namespace gossipcc
