// All-reduce and reduce-scatter of CPU buffers by direct exchange (docs/comm.md): chunk p goes
// to rank p, which reduces the n copies in rank order (float16/bfloat16 in float32, rounded
// once) and sends the result to every peer: the ring's bytes in 2 exchanges, in overlapping
// slices above kDirectSliceBytes. Same count, dtype and op on every rank (checked before).
#pragma once

#include "comm/core/types.h"
#include "comm/gloo/call.h"

namespace gossipcc {

void DirectAllreduce(const GlooCall& call, Buffer data, ReduceOp op);

// input: block p (output.count elements) for rank p; output: this rank's reduced block.
void DirectReduceScatter(const GlooCall& call, Buffer input, Buffer output, ReduceOp op);

}  // namespace gossipcc
