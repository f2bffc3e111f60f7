// CPU collectives on a connected Gloo context. Arguments were validated by the
// Communicator and agreed across ranks (consistency_check.h); these run the data path.
// Gloo exceptions escape as they are; the caller maps them (RethrowGlooError).
#pragma once

#include <vector>

#include "comm/core/reduce.h"
#include "comm/core/types.h"
#include "comm/gloo/call.h"

namespace gossipcc {

void GlooAllreduce(const GlooCall& call, Buffer data, ReduceOp op);
// input: size * output.count elements; output: this rank's reduced block.
void GlooReduceScatter(const GlooCall& call, Buffer input, Buffer output, ReduceOp op);
void GlooBroadcast(const GlooCall& call, Buffer data, int root);
void GlooAllgather(const GlooCall& call, Buffer input, Buffer output);
void GlooAllgatherv(const GlooCall& call, Buffer input, Buffer output, const std::vector<size_t>& counts);
void GlooAlltoall(const GlooCall& call, Buffer input, Buffer output);
void GlooAlltoallv(const GlooCall& call, Buffer input, const std::vector<size_t>& send_counts, Buffer output,
                   const std::vector<size_t>& recv_counts);
void GlooBarrier(const GlooCall& call);

}  // namespace gossipcc
