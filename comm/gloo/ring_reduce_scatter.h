// Reduce-scatter around a ring of unbound buffers (Debian's Gloo has none): n-1 steps, each
// rank moves (n-1)/n of the input.
#pragma once

#include "comm/gloo/call.h"

namespace gossipcc {

// input: size * output.count elements; output: this rank's chunk. Not float16/bfloat16.
void RingReduceScatter(const GlooCall& call, Buffer input, Buffer output, ReduceOp op);

}  // namespace gossipcc
