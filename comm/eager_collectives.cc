#include "comm/eager_collectives.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/errors.h"
#include "comm/reduce.h"

namespace gossipcc {
namespace {

// Guards the invariant that ranks agreeing on the header also agree on the eager plan.
void RequirePayload(const CollectiveHandshake& handshake, int rank, size_t bytes) {
  if (handshake.payload_bytes(rank) != bytes) {
    throw CommError(absl::StrCat("eager collective: rank ", rank, " sent ", handshake.payload_bytes(rank),
                                 " payload bytes, ", bytes, " expected (internal error)"));
  }
}

// out <- reduce over r of (payload(r) + offset), count elements of out.dtype, in rank order.
void ReduceInRankOrder(const CollectiveHandshake& handshake, int size, size_t offset_bytes, Buffer out, ReduceOp op) {
  const size_t count = out.count;
  if (count == 0) return;
  auto source = [&](int r) { return handshake.payload(r) + offset_bytes; };
  if (IsHalfPrecision(out.dtype)) {
    // Accumulate wide, round once (as the ring path does).
    const ReduceFn fn = GetReduceFn(DType::kFloat32, op);
    std::vector<float> acc(count), next(count);
    WidenToFloat(source(0), out.dtype, acc.data(), count);
    for (int r = 1; r < size; ++r) {
      WidenToFloat(source(r), out.dtype, next.data(), count);
      fn(acc.data(), acc.data(), next.data(), count);
    }
    const float scale = op == ReduceOp::kAvg ? 1.0f / static_cast<float>(size) : 1.0f;
    NarrowFromFloat(acc.data(), scale, out.dtype, out.data, count);
    return;
  }
  const ReduceFn fn = GetReduceFn(out.dtype, op);
  std::memcpy(out.data, source(0), out.bytes());
  for (int r = 1; r < size; ++r) fn(out.data, out.data, source(r), count);
  if (op == ReduceOp::kAvg) ScaleInPlace(out.data, count, out.dtype, 1.0 / static_cast<double>(size));
}

}  // namespace

void EagerAllreduce(const CollectiveHandshake& handshake, int size, Buffer data, ReduceOp op) {
  for (int r = 0; r < size; ++r) RequirePayload(handshake, r, data.bytes());
  ReduceInRankOrder(handshake, size, 0, data, op);
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

void EagerReduceScatter(const CollectiveHandshake& handshake, int size, int rank, Buffer output, ReduceOp op) {
  for (int r = 0; r < size; ++r) RequirePayload(handshake, r, output.bytes() * size);
  ReduceInRankOrder(handshake, size, output.bytes() * rank, output, op);
}

}  // namespace gossipcc
