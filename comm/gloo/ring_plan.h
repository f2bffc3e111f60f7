// Which part of the buffer each message of a ring all-reduce carries (ring_allreduce.h,
// packed_ring_allreduce.h): n chunks, each cut into S segments, 2(n-1)S messages.
#pragma once

#include <algorithm>
#include <cstddef>

namespace gossipcc {
// A segment is at most this large, and a chunk has at least kRingMinSegmentsPerChunk of them, so
// that a segment is forwarded while the next one is still arriving and no link waits for a
// whole chunk. Large enough that per-message costs (a wake-up of the waiting thread each)
// stay small on loopback, small enough to bound the receive slots to kRingWindow MiB.
inline constexpr size_t kRingMaxSegmentBytes = size_t{1} << 20;
inline constexpr size_t kRingMinSegmentsPerChunk = 2;
// Receives posted ahead of the one being waited for; the reduce-scatter's land in as many
// scratch slots.
inline constexpr int kRingWindow = 4;

struct RingSpan {
  size_t first;  // element offset in the buffer
  size_t count;
};

// Which part of the buffer each message of the ring carries. Messages are numbered u =
// 0..2P-1, P = (n-1)S: u < P is reduce-scatter step u/S, else all-gather step (u-P)/S, and
// segment u%S of the chunk that step moves. Rank r's message u goes to rank r+1 as that
// rank's message u, so both sides derive the same span from (u, chunk).
class RingPlan {
 public:
  RingPlan(int size, int rank, size_t count, size_t element_size) : n_(size), rank_(rank), count_(count) {
    const size_t n = static_cast<size_t>(size);
    const size_t max_chunk = (count + n - 1) / n;
    size_t segments =
        std::max(kRingMinSegmentsPerChunk, (max_chunk * element_size + kRingMaxSegmentBytes - 1) / kRingMaxSegmentBytes);
    // No empty segments where the chunks allow it (a message of zero bytes is skipped by
    // both of its ends).
    segments = std::max<size_t>(1, std::min(segments, count / n));
    segments_ = static_cast<int>(segments);
    max_segment_ = (max_chunk + segments - 1) / segments;
  }

  int segments() const { return segments_; }
  int phase_messages() const { return (n_ - 1) * segments_; }  // P
  int messages() const { return 2 * phase_messages(); }
  size_t max_segment() const { return max_segment_; }

  // What this rank receives as message u, and what it sends as message u.
  RingSpan Received(int u) const { return Piece(ChunkReceived(u), u % segments_); }
  RingSpan Sent(int u) const { return Piece(ChunkSent(u), u % segments_); }
  // The chunk this rank completes in the reduce-scatter (the first the all-gather sends).
  RingSpan OwnedChunk() const {
    const int c = Mod(rank_ + 1);
    return {ChunkBegin(c), ChunkBegin(c + 1) - ChunkBegin(c)};
  }

 private:
  int Mod(int i) const { return ((i % n_) + n_) % n_; }
  int Step(int u) const { return (u < phase_messages() ? u : u - phase_messages()) / segments_; }
  // Reduce-scatter step s receives chunk r-s-1; all-gather step g receives chunk r-g.
  int ChunkReceived(int u) const { return u < phase_messages() ? Mod(rank_ - Step(u) - 1) : Mod(rank_ - Step(u)); }
  int ChunkSent(int u) const { return u < phase_messages() ? Mod(rank_ - Step(u)) : Mod(rank_ + 1 - Step(u)); }
  size_t ChunkBegin(int c) const { return count_ * static_cast<size_t>(c) / static_cast<size_t>(n_); }
  RingSpan Piece(int chunk, int segment) const {
    const size_t begin = ChunkBegin(chunk);
    const size_t length = ChunkBegin(chunk + 1) - begin;
    const size_t s = static_cast<size_t>(segments_);
    const size_t first = begin + length * static_cast<size_t>(segment) / s;
    return {first, begin + length * static_cast<size_t>(segment + 1) / s - first};
  }

  const int n_;
  const int rank_;
  const size_t count_;
  int segments_ = 1;
  size_t max_segment_ = 0;
};

}  // namespace gossipcc
