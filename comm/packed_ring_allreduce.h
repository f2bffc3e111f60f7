// All-reduce of a float32 CPU buffer around a ring whose messages are packed losslessly
// (float32_packing.h): the ring of ring_allreduce.h, with the same order of reductions and so
// the same result bits, but each segment travels packed. Gradients pack to less than their
// size, so on a link that is the bottleneck the all-reduce takes that much less time (see
// docs/benchmarks.md#a-exact-all-reduce-backendgossipcc-vs-backendgloo); the price is CPU time
// to pack and unpack each segment, which a link slower than memory hides and a fast one
// (loopback, shared memory) does not: CommunicatorOptions::lossless_float32_allreduce turns it
// on, per communicator.
//
// Unlike the plain ring, messages do not come from or land in the caller's buffer: a segment is
// packed into one of kSendSlots send slots as late as the pipeline allows (kRingWindow sends
// ahead of the receive being waited for) and unpacked from a receive slot into the buffer (the
// all-gather's) or into a staging area and reduced from there (the reduce-scatter's). An
// all-gather segment forwarded one hop on is packed again from the buffer, which yields the
// bytes that arrived. Memory: (kRingWindow + kSendSlots) packed segments and one unpacked
// segment, about 14 MB at the largest segment (1 MiB), whatever the buffer's size.
//
// The signature check overlaps the first messages as in ring_allreduce.h; before the verdict
// nothing is written to the caller's buffer.
#pragma once

#include "comm/gloo_call.h"
#include "comm/types.h"

namespace gossipcc {

// Every rank calls it with the same count and op on a float32 buffer, and with the packed
// ring chosen alike (the communicator agrees on the option at creation).
void PackedRingAllreduce(const GlooCall& call, Buffer data, ReduceOp op);

}  // namespace gossipcc
