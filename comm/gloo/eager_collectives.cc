#include "comm/gloo/eager_collectives.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"
#include "comm/core/reduce.h"

namespace gossipcc {
namespace {

// Guards the invariant that ranks agreeing on the header also agree on the eager plan.
void RequirePayload(const CollectiveHandshake& handshake, int rank, size_t bytes) {
  if (handshake.payload_bytes(rank) != bytes) {
    throw CommError(absl::StrCat("eager collective: rank ", rank, " sent ", handshake.payload_bytes(rank),
                                 " payload bytes, ", bytes, " expected (internal error)"));
  }
}

// out <- reduce over r of (payload(r) + offset), out.count elements, in rank order.
void ReduceEagerPayloads(const CollectiveHandshake& handshake, int size, size_t offset_bytes, Buffer out, ReduceOp op,
                         WideScratch& scratch) {
  std::vector<const void*> sources(size);
  for (int r = 0; r < size; ++r) sources[r] = handshake.payload(r) + offset_bytes;
  ReduceInRankOrder(sources, out, op, scratch);
}

}  // namespace

void EagerAllreduce(const CollectiveHandshake& handshake, int size, Buffer data, ReduceOp op, WideScratch& scratch) {
  for (int r = 0; r < size; ++r) RequirePayload(handshake, r, data.bytes());
  ReduceEagerPayloads(handshake, size, 0, data, op, scratch);
}

void EagerBroadcast(const CollectiveHandshake& handshake, int rank, Buffer data, int root) {
  RequirePayload(handshake, root, data.bytes());
  if (rank != root && data.count) std::memcpy(data.data, handshake.payload(root), data.bytes());
}

void EagerAllgatherv(const CollectiveHandshake& handshake, int size, Buffer output, const std::vector<size_t>& counts) {
  const size_t element = ElementSize(output.dtype);
  uint8_t* dst = static_cast<uint8_t*>(output.data);
  for (int r = 0; r < size; ++r) {
    const size_t bytes = counts[r] * element;
    RequirePayload(handshake, r, bytes);
    if (bytes) std::memcpy(dst, handshake.payload(r), bytes);
    dst += bytes;
  }
}

void EagerReduceScatter(const CollectiveHandshake& handshake, int size, int rank, Buffer output, ReduceOp op,
                        WideScratch& scratch) {
  for (int r = 0; r < size; ++r) RequirePayload(handshake, r, output.bytes() * size);
  ReduceEagerPayloads(handshake, size, output.bytes() * rank, output, op, scratch);
}

}  // namespace gossipcc
