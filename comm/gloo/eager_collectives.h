// Small CPU collectives completed inside the signature handshake (consistency_check.h):
// every rank's payload has reached every rank in one message latency, and each of these
// finishes the collective locally. Reductions combine ranks in rank order 0, 1, ..., n-1,
// so every rank computes a bitwise identical result.
#pragma once

#include <vector>

#include "comm/core/reduce.h"
#include "comm/core/types.h"
#include "comm/gloo/consistency_check.h"

namespace gossipcc {

// Payload: the rank's `data`. data <- reduce over ranks (float16/bfloat16 accumulate in float32).
void EagerAllreduce(const CollectiveHandshake& handshake, int size, Buffer data, ReduceOp op, WideScratch& scratch);
// Payload: `data` on the root, nothing elsewhere. data <- the root's data.
void EagerBroadcast(const CollectiveHandshake& handshake, int rank, Buffer data, int root);
// Payload: `input`. output <- every rank's payload in rank order (counts[r] elements from rank r).
void EagerAllgatherv(const CollectiveHandshake& handshake, int size, Buffer output, const std::vector<size_t>& counts);
// Payload: the whole `input` (size x output.count). output <- reduce over ranks of chunk `rank`.
void EagerReduceScatter(const CollectiveHandshake& handshake, int size, int rank, Buffer output, ReduceOp op,
                        WideScratch& scratch);

}  // namespace gossipcc
