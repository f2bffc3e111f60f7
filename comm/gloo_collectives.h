// CPU collectives on a connected Gloo context. Arguments were validated by the
// Communicator and agreed across ranks (consistency_check.h); these run the data path.
// Gloo exceptions escape as they are; the caller maps them (RethrowGlooError).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/reduce.h"
#include "comm/types.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace gossipcc {

// Memory a collective may keep between calls (one collective runs at a time per communicator).
struct CollectiveScratch {
  std::vector<uint8_t> bytes;
  WideScratch wide;
  // Gloo buffers (and memory they point at) of a collective that failed part-way. Gloo's
  // device thread may still complete or fail operations posted on them, so they are freed
  // only after the Gloo context (and its pairs) is gone. A failure poisons the
  // communicator, so `bytes` is never resized after one.
  std::vector<std::shared_ptr<void>> retired;
};

struct GlooCall {
  std::shared_ptr<gloo::Context> context;
  uint32_t tag;
  std::chrono::milliseconds timeout;
  CollectiveScratch* scratch;  // the communicator's; never null
};

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
