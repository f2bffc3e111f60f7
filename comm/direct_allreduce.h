// All-reduce and reduce-scatter of CPU buffers by direct exchange: every rank sends each
// peer exactly the part that peer reduces, instead of passing partial sums around a ring.
//
// All-reduce: rank r owns chunk r of the buffer. Phase 1 (reduce-scatter): every rank sends
// chunk p of its data straight to rank p and reduces the n copies of its own chunk, combining
// ranks in rank order. Phase 2 (all-gather): every rank sends its reduced chunk straight to
// every peer, which receives it in place. Each rank sends and receives 2(n-1)/n of the
// buffer, as in a ring, but in 2 message latencies instead of the ring's 2(n-1): on a switched
// network (every host its own full-duplex link) that is the same bandwidth term with fewer
// round trips, which is what mid-size messages (DDP buckets, PowerSGD factors) pay for.
//
// float16/bfloat16 travel in their own width and are reduced in float32 by the chunk's owner,
// who sees every rank's raw values and rounds once, so every rank gets identical bits. A ring
// can only accumulate wide by sending float32 partial sums (twice the wire bytes), which is
// why half-precision buffers take this path at every size.
//
// Buffers above kDirectSliceBytes (communicator.h) go in slices of that size (bounded staging
// memory), with slice k's all-gather overlapping slice k+1's reduce-scatter.
#pragma once

#include "comm/gloo_call.h"
#include "comm/types.h"

namespace gossipcc {

// Every rank calls it with the same count, dtype and op (checked beforehand by the handshake).
void DirectAllreduce(const GlooCall& call, Buffer data, ReduceOp op);

// input: size * output.count elements, block p for rank p; output: this rank's reduced block
// (may be input's block `rank`). Same preconditions.
void DirectReduceScatter(const GlooCall& call, Buffer input, Buffer output, ReduceOp op);

}  // namespace gossipcc
