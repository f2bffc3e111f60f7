// All-reduce and reduce-scatter of CPU buffers by direct exchange (docs/comm.md): rank p reduces
// chunk p of every rank in rank order (float16/bfloat16 in float32, rounded once) and sends it to
// every peer. Same count, dtype and op on every rank (the caller has run the signature check).
#pragma once

#include "comm/core/types.h"
#include "comm/gloo/call.h"

namespace gossipcc {

void DirectAllreduce(const GlooCall& call, Buffer data, ReduceOp op);

// input: block p (output.count elements) for rank p; output: this rank's reduced block.
void DirectReduceScatter(const GlooCall& call, Buffer input, Buffer output, ReduceOp op);

}  // namespace gossipcc
