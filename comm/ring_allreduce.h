// All-reduce of a CPU buffer around a ring (docs/comm.md, "The ring"), in place, pipelined in
// segments: 2(n-1)/n of it sent per rank, the same bits on every rank. Same count, dtype (not
// float16/bfloat16) and op on every rank; the signature check overlaps the first segments, and a
// disagreement raises the same MismatchError on every rank before anything reaches `data`.
#pragma once

#include "comm/gloo_call.h"
#include "comm/types.h"

namespace gossipcc {

void RingAllreduce(const GlooCall& call, Buffer data, ReduceOp op);

}  // namespace gossipcc
