// All-reduce of a CPU buffer around a ring, in place, pipelined in segments, with the
// signature check overlapped with the first messages.
//
// The buffer is cut into n chunks and each chunk into S segments. Reduce-scatter: in step
// s = 0..n-2 rank r sends chunk r-s to its right neighbour and receives chunk r-s-1 from its
// left one, which it adds into its own copy; after n-1 steps it holds chunk r+1 fully
// reduced. All-gather: that chunk travels once around the ring, received in place. Each rank
// sends and receives 2(n-1)/n of the buffer, the least any all-reduce can. Segments make it a
// pipeline: a segment is forwarded as soon as it is reduced, while the next one is still on
// the wire, so the link never waits for a whole chunk. Every rank ends with the bits its
// chunk's owner computed, so results are identical on every rank.
//
// Overlapped check (call.check): a ring rank talks only to its two neighbours, so it need not
// wait for every rank's signature before its data leaves. It posts its first receives (into
// scratch memory), sends its signature, and as soon as its right neighbour's signature is in
// and identical to its own it sends its first segments (those the neighbour has posted
// receives for). Only then does it wait for the whole table. If the ranks disagree, every rank
// raises the same MismatchError, having waited for exactly the speculative messages its
// agreeing neighbours exchanged with it; nothing reached the caller's buffer (the first
// receives land in scratch, and nothing is reduced before the verdict). Without this, every
// rank would wait for the slowest rank's signature plus a message latency before the ring's
// first byte moved.
#pragma once

#include "comm/gloo_call.h"
#include "comm/types.h"

namespace gossipcc {

// Every rank calls it with the same count, dtype (not float16/bfloat16: those accumulate wide,
// direct_allreduce.h) and op, or the check rejects the call.
void RingAllreduce(const GlooCall& call, Buffer data, ReduceOp op);

}  // namespace gossipcc
