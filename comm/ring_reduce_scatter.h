// Reduce-scatter over a ring of unbound buffers (Gloo 2022 has no unbound-buffer
// reduce-scatter). n-1 steps; each rank sends and receives one chunk per step, so every
// rank moves (n-1)/n of the input, the bandwidth-optimal amount.
#pragma once

#include "comm/gloo_call.h"

namespace gossipcc {

// input: size * output.count elements; output: this rank's reduced chunk. Not for
// float16/bfloat16 (DirectReduceScatter reduces those wide without widening the wire).
void RingReduceScatter(const GlooCall& call, Buffer input, Buffer output, ReduceOp op);

}  // namespace gossipcc
