// How the quantized all-reduce (compression/quantized_allreduce.h) lays a buffer out over the
// ranks, and one call's state that its steps share. Internal to compression/.
//  - The buffer is cut into slices of whole blocks (kQuantizedSliceElements each), so that one
//    slice's sum overlaps the next one's rounds; in each slice rank r owns a contiguous range of
//    whole blocks (FirstBlockOf), which it sums and quantizes again.
//  - Every rank computes the same plan from (count, block size, bits, ranks) alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "comm/core/types.h"
#include "compression/quantized_allreduce.h"

namespace gossipcc {
namespace quantized_internal {

// A slice of the buffer: per rank r, the blocks it owns in it, as elements
// [elem[r], elem[r+1]) and quantized bytes [byte[r], byte[r+1]) (range_bytes[r] of them).
struct Slice {
  std::vector<size_t> elem, byte, range_bytes;
  uint8_t* received = nullptr;  // n copies of this rank's region (scratch.received)
  std::vector<float> new_owned;  // the owned residual this call leaves (error feedback)
};

std::vector<Slice> PlanSlices(size_t count, size_t block, int bits, int n);

// A part of owner o's region of a slice that the ring all-gather moves as one message: whole
// blocks, bytes [byte0, byte1) of the encoding, elements [elem0, elem1).
struct Piece {
  size_t byte0, byte1, elem0, elem1;
};

// Owner o's region of slice `sl` in pieces of about kQuantizedGatherPieceBytes. Every rank cuts
// a region alike, so a piece received is forwarded as the same piece.
std::vector<Piece> PiecesOf(const Slice& sl, int o, size_t count, int bits, size_t block);

// One call, after its check: the arguments, the plan, and the memory its steps share.
struct QuantizedCall {
  Communicator& comm;
  int n, me, bits;
  size_t block, count;
  ReduceOp op;
  float* x;                // the caller's data, the result in the end
  float* sent_residual;    // error feedback's residuals (both null without it)
  float* owned_residual;
  std::vector<float> new_sent;  // the sent residual this call leaves
  std::vector<Slice> slices;
  // This rank's quantized input, then, region by region as the owners' sums arrive, the result
  // (owner o's region of a slice is sent to o in the scatter before o's sum overwrites it).
  uint8_t* quantized;
  std::vector<float>* sum;  // the owner's float32 sum of a slice's region (scratch)
  QuantizedAllreduceStats stats;

  bool feedback() const { return sent_residual != nullptr; }
};

}  // namespace quantized_internal
}  // namespace gossipcc
