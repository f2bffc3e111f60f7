// ArgumentChecks: what a valid argument of a Communicator call is. Every check runs on the
// calling thread before anything is queued or sent, and throws InvalidArgumentError naming the
// rank, the operation and the argument ("rank 1 of 4: allgather: output is float16 but ...").
// A call's own arithmetic (allgather's output count, ...) is checked in communicator.cc.
#pragma once

#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/core/p2p_op.h"
#include "comm/core/types.h"

namespace gossipcc {

struct ArgumentChecks {
  int rank;
  int size;
  int cuda_device;  // the CUDA device the communicator is bound to, -1 while none

  std::string Where(const std::string& op) const;  // "rank 1 of 4: <op>"

  // Non-null unless empty, a valid dtype, a usable device: CPU (index -1), or a visible CUDA
  // device that is the communicator's own once it has one.
  void Buffer(const char* op, const char* name, const gossipcc::Buffer& b) const;
  // Input and output of one dtype and device.
  void Same(const char* op, const gossipcc::Buffer& a, const gossipcc::Buffer& b) const;
  void Peer(const char* op, int peer, const char* what) const;  // in [0, size)
  void Counts(const char* op, const char* name, const std::vector<size_t>& counts) const;  // one per rank
  // The op applies to the buffer's dtype (CheckReduceSupported) and device (no bitwise op on
  // CUDA: NCCL has none).
  void Reduce(const char* op, const gossipcc::Buffer& b, ReduceOp reduce) const;
  // A point-to-point batch (not empty): each buffer (or gathered send) valid, peers in range and
  // not this rank, kAnySource only for CPU receives and only where `any_source` (recv_any_source
  // and p2p batches; plain recv() keeps -1 an out-of-range peer), CPU and CUDA not mixed,
  // progress on CPU only. Returns the batch's description for its Work and errors.
  std::string P2P(absl::Span<const P2POp> ops, bool any_source) const;

 private:
  // A gathered send: CPU pieces of the message's dtype whose counts add up to its count.
  void Gather(const char* name, const P2POp& op) const;
};

}  // namespace gossipcc
