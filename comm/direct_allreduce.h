// All-reduce of a CPU buffer as a direct reduce-scatter followed by a direct all-gather.
//
// Rank r owns chunk r of the buffer. Phase 1: every rank sends chunk p of its data straight
// to rank p and reduces the n copies of its own chunk, combining ranks in rank order. Phase 2:
// every rank sends its reduced chunk straight to every peer, which receives it in place. Each
// rank sends and receives 2(n-1)/n of the buffer, as in a ring, but in 2 message latencies
// instead of the ring's 2(n-1): on a switched network (every host its own full-duplex link)
// that is the same bandwidth term with fewer round trips, which is what mid-size messages
// (DDP buckets, PowerSGD factors) pay for. float16/bfloat16 travel in their own width and are
// reduced in float32 (rounded once, by the chunk's owner), so every rank gets identical bits.
#pragma once

#include "comm/communicator.h"  // kDirectAllreduceMaxBytes
#include "comm/gloo_collectives.h"
#include "comm/types.h"

namespace gossipcc {

// Every rank calls it with the same count, dtype and op (checked beforehand by the handshake).
void DirectAllreduce(const GlooCall& call, Buffer data, ReduceOp op);

}  // namespace gossipcc
