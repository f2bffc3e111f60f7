// All-reduce of a CPU buffer in place, in two levels over the ranks' hosts (docs/comm.md, "Hosts
// with several ranks"): the same bits on every rank, the flat ring's up to the order of additions.
// Same count, dtype (not float16/bfloat16) and op on every rank, as many ranks on every host
// (Topology::uniform); a disagreement raises one MismatchError everywhere, `data` untouched.
#pragma once

#include "comm/core/topology.h"
#include "comm/core/types.h"
#include "comm/gloo/call.h"

namespace gossipcc {

void HierarchicalAllreduce(const GlooCall& call, const Topology& topology, Buffer data, ReduceOp op);

}  // namespace gossipcc
