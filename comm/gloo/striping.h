// Several TCP streams per peer pair (streams_per_peer = k; docs/comm.md, "Streams per peer"): a
// payload cut in pieces sends piece i on stream i % k, posted and matched in order on both ends,
// so the bytes, reduction order and result are one stream's; a one-piece payload stays on stream 0.
#pragma once

#include <cstddef>

#include "comm/gloo/ring_plan.h"  // kRingWindow

namespace gossipcc {

inline size_t StreamOf(size_t piece, size_t streams) { return piece % streams; }

// Ring messages announced ahead of the one awaited (and reduce-scatter slots) over `streams`.
inline int RingWindow(int streams) { return kRingWindow * streams; }

}  // namespace gossipcc
