#include "compression/quantized_plan.h"

#include <algorithm>
#include <utility>

#include "compression/quantized_blocks.h"

namespace gossipcc {
namespace quantized_internal {
namespace {

size_t FirstBlockOf(size_t blocks, int rank, int ranks) {
  return static_cast<size_t>((static_cast<unsigned __int128>(blocks) * static_cast<unsigned>(rank)) /
                             static_cast<unsigned>(ranks));
}

size_t SliceBlocks(size_t block_size) { return std::max<size_t>(1, kQuantizedSliceElements / block_size); }

}  // namespace

std::vector<Slice> PlanSlices(size_t count, size_t block, int bits, int n) {
  const size_t blocks = BlockCount(count, block);
  const size_t per_slice = SliceBlocks(block);
  std::vector<Slice> slices;
  for (size_t b0 = 0; b0 < blocks; b0 += per_slice) {
    const size_t b1 = std::min(blocks, b0 + per_slice);
    Slice sl;
    sl.elem.resize(n + 1);
    sl.byte.resize(n + 1);
    sl.range_bytes.resize(n);
    for (int r = 0; r <= n; ++r) {
      const size_t b = b0 + FirstBlockOf(b1 - b0, r, n);
      sl.elem[r] = std::min(count, b * block);
      sl.byte[r] = BlockOffset(b, count, bits, block);
    }
    for (int r = 0; r < n; ++r) sl.range_bytes[r] = sl.byte[r + 1] - sl.byte[r];
    slices.push_back(std::move(sl));
  }
  return slices;
}

std::vector<Piece> PiecesOf(const Slice& sl, int o, size_t count, int bits, size_t block) {
  std::vector<Piece> out;
  const size_t e0 = sl.elem[o], e1 = sl.elem[o + 1];
  if (e1 == e0) return out;
  const size_t b0 = e0 / block, b1 = (e1 + block - 1) / block, blocks = b1 - b0;
  const size_t k = std::clamp<size_t>(
      (sl.range_bytes[o] + kQuantizedGatherPieceBytes - 1) / kQuantizedGatherPieceBytes, 1, blocks);
  for (size_t j = 0; j < k; ++j) {
    const size_t p0 = b0 + blocks * j / k, p1 = b0 + blocks * (j + 1) / k;
    out.push_back({BlockOffset(p0, count, bits, block), BlockOffset(p1, count, bits, block), p0 * block,
                   std::min(count, p1 * block)});
  }
  return out;
}

}  // namespace quantized_internal
}  // namespace gossipcc
