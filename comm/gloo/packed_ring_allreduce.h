// The ring of ring_allreduce.h for float32 with every segment packed losslessly
// (float32_packing.h; CommunicatorOptions::lossless_float32_allreduce): the same reductions in
// the same order, so the same bits, on fewer bytes for CPU time (docs/comm.md, "Lossless
// packing"); bounded scratch whatever the size. Same count and op on every rank.
#pragma once

#include "comm/core/types.h"
#include "comm/gloo/call.h"

namespace gossipcc {

void PackedRingAllreduce(const GlooCall& call, Buffer data, ReduceOp op);

}  // namespace gossipcc
