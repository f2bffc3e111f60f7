// All-reduce of a CPU buffer in two levels over the hosts the ranks are on (topology.h), in
// place: a ring reduce-scatter among each host's G ranks, leaving local rank i with chunk i + 1
// of G summed over its host; a ring all-reduce of that chunk among the H ranks with local rank
// i (one per host), so the host's G ranks each carry 1/G of the data across its NIC, in
// parallel; a ring all-gather among each host's ranks. Across hosts each host sends 2(H-1)/H of
// the buffer, in 2(H-1) steps instead of the flat ring's 2(HG-1).
//
// Every rank gets the same bits (each chunk is reduced by one ring across hosts, and averaged
// once there, for kAvg); they equal the flat ring's up to the order of the additions (a sum
// over hosts of sums over each host's ranks). Same count, dtype (not float16/bfloat16) and op
// on every rank; every host must have as many ranks (Topology::uniform). The signature check
// runs before the first message, so a disagreement raises the same MismatchError everywhere
// with `data` untouched.
#pragma once

#include "comm/core/topology.h"
#include "comm/core/types.h"
#include "comm/gloo/call.h"

namespace gossipcc {

void HierarchicalAllreduce(const GlooCall& call, const Topology& topology, Buffer data, ReduceOp op);

}  // namespace gossipcc
