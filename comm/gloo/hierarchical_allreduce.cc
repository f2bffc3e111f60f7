#include "comm/gloo/hierarchical_allreduce.h"

#include <gloo/context.h>

#include "comm/core/reduce.h"
#include "comm/gloo/ring_allreduce.h"
#include "comm/gloo/ring_plan.h"

namespace gossipcc {

void HierarchicalAllreduce(const GlooCall& call, const Topology& topology, Buffer data, ReduceOp op) {
  RunCheck(call);  // before any message: the phases below run without it
  GlooCall phase = call;
  phase.check = nullptr;
  const int rank = call.context->rank;
  const RingMembers host = RingMembers::Of(topology.ranks_on_host(topology.host_of(rank)), rank);
  const RingMembers across = RingMembers::Of(topology.across_hosts(rank), rank);
  // Sums on the way; kAvg divides once, after the last addition, on the chunk's one ring.
  const ReduceOp sum_or_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;

  // 1. Inside the host: local rank i ends with its chunk summed over the host.
  RingAllreduceAmong(phase, host, data, sum_or_op, RingPhases::kReduceScatter);
  // 2. Across hosts: that chunk all-reduced among the ranks that hold it on every host.
  const RingSpan chunk = RingPlan(host.size, host.index, data.count, ElementSize(data.dtype)).OwnedChunk();
  Buffer part = data;
  part.data = static_cast<uint8_t*>(data.data) + chunk.first * ElementSize(data.dtype);
  part.count = chunk.count;
  RingAllreduceAmong(phase, across, part, sum_or_op, RingPhases::kBoth);
  if (op == ReduceOp::kAvg && part.count) {
    ScaleInPlace(part.data, part.count, data.dtype, 1.0 / static_cast<double>(topology.size()));
  }
  // 3. Inside the host: every chunk to every local rank.
  RingAllreduceAmong(phase, host, data, sum_or_op, RingPhases::kAllgather);
}

}  // namespace gossipcc
