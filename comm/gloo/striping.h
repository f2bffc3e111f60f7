// Several TCP streams per peer pair (CommunicatorOptions::streams_per_peer = k): how large
// payloads are dealt over a pair's k connections, one per mesh (meshes.h connects them).
//
// One TCP stream moves at most its window per round trip; on a link whose bandwidth-delay
// product exceeds what a stock host lets one stream have (tcp_wmem / tcp_rmem maxima), a
// payload on one stream cannot fill the link, and k streams can carry k windows. A payload
// already cut into pieces for pipelining (the ring all-reduce's messages, ring_plan.h; the
// point-to-point segments, comm/p2p/wire.h) deals them over the streams: piece i travels on stream
// i % k. Each stream's pieces are posted, and matched by Gloo, in order on both ends, so the
// receiver places every piece by its number alone; no piece is cut further, and the bytes,
// the reduction order and the result are those of one stream. A payload of one piece (a
// point-to-point message of at most one segment, the direct all-reduce's and the signature
// check's messages) stays on the first stream.
//
// Receives announced ahead scale with k (each stream keeps its own window), so the bytes in
// flight per peer pair grow with the streams, which is the point on a long fat pipe; the ring
// all-reduce's receive slots grow with them (RingWindow).
#pragma once

#include <cstddef>

#include "comm/gloo/ring_plan.h"  // kRingWindow

namespace gossipcc {

// The stream that carries piece `piece` of a payload dealt over `streams` streams.
inline size_t StreamOf(size_t piece, size_t streams) { return piece % streams; }

// Ring messages announced ahead of the one being waited for (and reduce-scatter receive
// slots) with `streams` streams per peer: kRingWindow per stream.
inline int RingWindow(int streams) { return kRingWindow * streams; }

}  // namespace gossipcc
