#include "comm/ring_allreduce.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/errors.h"
#include "comm/gloo_util.h"
#include "comm/reduce.h"

namespace gossipcc {
namespace {

// A segment is at most this large, and a chunk has at least kMinSegmentsPerChunk of them, so
// that a segment is forwarded while the next one is still arriving and no link waits for a
// whole chunk. Large enough that per-message costs (a wake-up of the waiting thread each)
// stay small on loopback (256 KiB took 1.1-1.7x Gloo's time there, docs/benchmarks_history.md), small
// enough to bound the receive slots to kWindow MiB.
constexpr size_t kMaxSegmentBytes = size_t{1} << 20;
constexpr size_t kMinSegmentsPerChunk = 2;
// Receives posted ahead of the one being waited for; the reduce-scatter's land in as many
// scratch slots.
constexpr int kWindow = 4;

struct Span {
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
        std::max(kMinSegmentsPerChunk, (max_chunk * element_size + kMaxSegmentBytes - 1) / kMaxSegmentBytes);
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
  Span Received(int u) const { return Piece(ChunkReceived(u), u % segments_); }
  Span Sent(int u) const { return Piece(ChunkSent(u), u % segments_); }

 private:
  int Mod(int i) const { return ((i % n_) + n_) % n_; }
  int Step(int u) const { return (u < phase_messages() ? u : u - phase_messages()) / segments_; }
  // Reduce-scatter step s receives chunk r-s-1; all-gather step g receives chunk r-g.
  int ChunkReceived(int u) const { return u < phase_messages() ? Mod(rank_ - Step(u) - 1) : Mod(rank_ - Step(u)); }
  int ChunkSent(int u) const { return u < phase_messages() ? Mod(rank_ - Step(u)) : Mod(rank_ + 1 - Step(u)); }
  size_t ChunkBegin(int c) const { return count_ * static_cast<size_t>(c) / static_cast<size_t>(n_); }
  Span Piece(int chunk, int segment) const {
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

// The ring on `data`, with this rank's receive slots at `scratch` (kWindow x max segment).
void RunRing(const GlooCall& call, Buffer data, ReduceOp op, const RingPlan& plan, uint8_t* scratch) {
  gloo::Context& ctx = *call.context;
  const int n = ctx.size;
  const int right = (ctx.rank + 1) % n;
  const int left = (ctx.rank + n - 1) % n;
  const size_t element = ElementSize(data.dtype);
  const int S = plan.segments();
  const int P = plan.phase_messages();
  const int U = plan.messages();
  const size_t slot_bytes = plan.max_segment() * element;
  const ReduceFn reduce = GetReduceFn(data.dtype, op);
  const uint64_t slot = MakeSlot(kRingAllreduceSlotPrefix, call.tag);
  auto* bytes = static_cast<uint8_t*>(data.data);

  PostedBuffers buffers(ctx, *call.retired);
  gloo::transport::UnboundBuffer& scratch_ub = buffers.Create(scratch, slot_bytes * kWindow);
  gloo::transport::UnboundBuffer& data_ub = buffers.Create(bytes, data.bytes());

  // Reduce-scatter messages land in scratch slot u % kWindow, all-gather ones in place.
  auto post_receive = [&](int u) {
    const Span s = plan.Received(u);
    if (s.count == 0) return;
    if (u < P) {
      scratch_ub.recv(left, slot, static_cast<size_t>(u % kWindow) * slot_bytes, s.count * element);
    } else {
      data_ub.recv(left, slot, s.first * element, s.count * element);
    }
  };
  int sends = 0;
  auto send = [&](int u) {
    const Span s = plan.Sent(u);
    if (s.count == 0) return;
    data_ub.send(right, slot, s.first * element, s.count * element);
    ++sends;
  };

  // Before the verdict: receives only into scratch, and sends only of messages the right
  // neighbour posted receives for before its signature left (its first kWindow).
  int posted = std::min(kWindow, P);
  for (int u = 0; u < posted; ++u) post_receive(u);
  const int ahead = std::min(S, kWindow);
  int sent = 0;
  if (call.check) {
    // The left neighbour sends its first messages here only once this rank's header is in,
    // and the right neighbour's first reduction waits for this rank's first messages: both
    // go before the headers that only the verdict needs (it has milliseconds of slack
    // before anything is written).
    call.check->Begin(left);
    if (call.check->PeerAgrees(right)) {
      for (; sent < ahead; ++sent) send(sent);
    }
    call.check->SendRemainingHeaders();
    // The left neighbour applies the same rule, so it sent its first `ahead` messages
    // exactly when it agrees with this rank.
    const bool left_sent = call.check->PeerAgrees(left);
    try {
      call.check->Finish();
    } catch (const MismatchError&) {
      // Every rank fails; first drain the messages that did leave, so that none of them
      // still refers to the caller's buffer or arrives after this returns. Receives the left
      // neighbour will never match stay posted on scratch memory, which is retired.
      for (int i = 0; i < sends; ++i) data_ub.waitSend(call.timeout);
      if (left_sent) {
        for (int u = 0; u < ahead; ++u) {
          if (plan.Received(u).count) scratch_ub.waitRecv(call.timeout);
        }
      }
      throw;
    }
  }
  for (; sent < S; ++sent) send(sent);

  const double avg_scale = 1.0 / static_cast<double>(n);
  for (int u = 0; u < U; ++u) {
    // A reduce-scatter slot is reused by message u + kWindow only once message u is reduced.
    for (; posted < U && posted < u + kWindow; ++posted) post_receive(posted);
    const Span s = plan.Received(u);
    uint8_t* target = bytes + s.first * element;
    if (s.count) {
      if (u < P) {
        scratch_ub.waitRecv(call.timeout);
        reduce(target, target, scratch + static_cast<size_t>(u % kWindow) * slot_bytes, s.count);
        // The last reduce-scatter step completes this rank's chunk: averaged once, here, so
        // every rank receives the same bits.
        if (u >= P - S && op == ReduceOp::kAvg) ScaleInPlace(target, s.count, data.dtype, avg_scale);
      } else {
        data_ub.waitRecv(call.timeout);
      }
    }
    // Message u + S forwards what just arrived: the partial sum one step on, the finished
    // chunk into the all-gather, or the gathered chunk one more hop.
    if (u + S < U) send(u + S);
  }
  for (int i = 0; i < sends; ++i) data_ub.waitSend(call.timeout);
}

}  // namespace

void RingAllreduce(const GlooCall& call, Buffer data, ReduceOp op) {
  const int n = call.context->size;
  if (n == 1 || data.count == 0) {
    RunCheck(call);
    return;
  }
  const RingPlan plan(n, call.context->rank, data.count, ElementSize(data.dtype));
  const size_t scratch_bytes = plan.max_segment() * ElementSize(data.dtype) * kWindow;
  std::shared_ptr<std::vector<uint8_t>>& kept = call.scratch->ring;
  if (!kept || kept->size() < scratch_bytes) kept = std::make_shared<std::vector<uint8_t>>(scratch_bytes);
  std::shared_ptr<std::vector<uint8_t>> slots = kept;
  try {
    RunRing(call, data, op, plan, slots->data());
  } catch (...) {
    // A receive may still be posted on the slots: they go with the failed call's buffers.
    kept.reset();
    call.retired->Add(std::move(slots));
    throw;
  }
}

}  // namespace gossipcc
