// What one rank was asked to do in one collective: the signature ranks compare before
// any payload moves (see consistency_check.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/core/types.h"

namespace gossipcc {

enum class OpKind : uint8_t {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kAllgatherv,
  kReduceScatter,
  kAlltoall,
  kAlltoallv,
  kBarrier,
};
const char* OpKindName(OpKind kind);

struct OpSpec {
  OpKind kind = OpKind::kBarrier;
  uint64_t seq = 0;  // position in this communicator's collective order
  DType dtype = DType::kUInt8;
  ReduceOp op = ReduceOp::kSum;  // reductions only
  int root = -1;                 // broadcast only
  uint64_t count = 0;            // the element count every rank must agree on
  uint64_t layout_hash = 0;      // allgatherv: hash of the counts vector
  Device device;
  // alltoallv: elements this rank sends to / expects from each peer.
  std::vector<size_t> send_counts;
  std::vector<size_t> recv_counts;

  bool has_reduce_op() const { return kind == OpKind::kAllreduce || kind == OpKind::kReduceScatter; }
  // "allreduce #12 (1024 x float32 on cpu, sum)"
  std::string Describe() const;
};

uint64_t HashCounts(const std::vector<size_t>& counts);

}  // namespace gossipcc
