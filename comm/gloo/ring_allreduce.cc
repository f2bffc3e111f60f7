#include "comm/gloo/ring_allreduce.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/core/errors.h"
#include "comm/core/reduce.h"
#include "comm/gloo/pair_teardown.h"
#include "comm/gloo/posted_buffers.h"
#include "comm/gloo/ring_common.h"
#include "comm/gloo/ring_plan.h"
#include "comm/gloo/slots.h"
#include "comm/gloo/striping.h"

namespace gossipcc {
namespace {

// A ring call's Gloo buffers on each of its k streams, over the scratch slots and over the
// data, and the sends posted on each so far; message u travels on stream u % k (striping.h).
class RingStreams {
 public:
  RingStreams(const GlooCall& call, uint8_t* scratch, size_t scratch_bytes, Buffer data) : k_(call.stream_count()) {
    for (int i = 0; i < k_; ++i) {
      posted_.push_back(std::make_unique<PostedBuffers>(call.stream(i), *call.retired));
      scratch_.push_back(&posted_.back()->Create(scratch, scratch_bytes));
      data_.push_back(&posted_.back()->Create(data.data, data.bytes()));
    }
    sends_.assign(static_cast<size_t>(k_), 0);
  }
  gloo::transport::UnboundBuffer& scratch(int u) { return *scratch_[Of(u)]; }
  gloo::transport::UnboundBuffer& data(int u) { return *data_[Of(u)]; }
  void Send(int u, int peer, uint64_t slot, size_t offset, size_t bytes) {
    data_[Of(u)]->send(peer, slot, offset, bytes);
    ++sends_[Of(u)];
  }
  // After a transport failure or timeout: closes the pairs with `left` and `right` on every
  // stream, so that no receive posted into the caller's data lands and no send posted from it
  // is written after the failure is reported (ClosePairsWith).
  void Abandon(const GlooCall& call, int left, int right) {
    std::vector<gloo::Context*> contexts;
    for (int i = 0; i < k_; ++i) contexts.push_back(&call.stream(i));
    ClosePairsWith(contexts, left);
    ClosePairsWith(contexts, right);
  }
  // Waits for every send posted so far.
  void WaitSends(std::chrono::milliseconds left) {
    for (size_t i = 0; i < sends_.size(); ++i) {
      for (; sends_[i] > 0; --sends_[i]) data_[i]->waitSend(left);
    }
  }

 private:
  size_t Of(int u) const { return StreamOf(static_cast<size_t>(u), static_cast<size_t>(k_)); }
  const int k_;
  // Declared first: on a throw the buffers go to the retired ones (PostedBuffers).
  std::vector<std::unique_ptr<PostedBuffers>> posted_;
  std::vector<gloo::transport::UnboundBuffer*> scratch_, data_;
  std::vector<int> sends_;
};

// The ring's messages of `phases` on `streams`, with this rank's receive slots at `scratch`
// (RingWindow(k) x max segment). Message u travels on stream u % k (striping.h), each stream's
// in order on both ends.
void RunRingMessages(const GlooCall& call, const RingMembers& ring, Buffer data, ReduceOp op, RingPhases phases,
                     const RingPlan& plan, uint8_t* scratch, RingStreams& streams) {
  const size_t element = ElementSize(data.dtype);
  const int S = plan.segments();
  const int P = plan.phase_messages();
  const int U = plan.messages();
  // The messages run here: [begin, end).
  const int begin = phases == RingPhases::kAllgather ? P : 0;
  const int end = phases == RingPhases::kReduceScatter ? P : U;
  const int window = RingWindow(call.stream_count());
  const size_t slot_bytes = plan.max_segment() * element;
  const ReduceFn reduce = GetReduceFn(data.dtype, op);
  const uint64_t slot = MakeSlot(kRingAllreduceSlotPrefix, call.tag);
  auto* bytes = static_cast<uint8_t*>(data.data);

  // Reduce-scatter messages land in scratch slot u % window, all-gather ones in place.
  auto post_receive = [&](int u) {
    const RingSpan s = plan.Received(u);
    if (s.count == 0) return;
    if (u < P) {
      streams.scratch(u).recv(ring.left, slot, static_cast<size_t>(u % window) * slot_bytes, s.count * element);
    } else {
      streams.data(u).recv(ring.left, slot, s.first * element, s.count * element);
    }
  };
  auto send = [&](int u) {
    const RingSpan s = plan.Sent(u);
    if (s.count == 0) return;
    streams.Send(u, ring.right, slot, s.first * element, s.count * element);
  };
  // All-gather message m lands where this rank's reduce-scatter message m - P left from. When
  // both phases run here it is posted only after that send (sends issued before step u: u + S),
  // so that the receive's writes follow the send's reads on this thread too, not only through
  // the network (ThreadSanitizer sees the former).
  auto may_post = [&](int m, int u) { return m < P || phases != RingPhases::kBoth || m - P < u + S; };

  // Before the verdict: receives only into scratch, and sends only of messages the right
  // neighbour posted receives for before its signature left (its first `window`).
  int posted = begin;
  for (; posted < std::min(begin + window, phases == RingPhases::kAllgather ? end : P); ++posted) post_receive(posted);
  const int ahead = begin + std::min(S, window);
  int sent = begin;
  RunOverlappedCheck(
      call, ring.left, ring.right, [&] {
        for (; sent < ahead; ++sent) send(sent);
      },
      [&](bool left_sent) {
        // None of the messages that left may still refer to the caller's buffer or arrive
        // after this returns. Receives the left neighbour will never match stay posted on
        // scratch memory, which is retired.
        streams.WaitSends(call.left());
        if (left_sent) {
          for (int u = 0; u < ahead; ++u) {
            if (plan.Received(u).count) streams.scratch(u).waitRecv(call.left());
          }
        }
      });
  for (; sent < begin + S; ++sent) send(sent);

  const double avg_scale = 1.0 / static_cast<double>(ring.size);
  for (int u = begin; u < end; ++u) {
    // A reduce-scatter slot is reused by message u + window only once message u is reduced.
    for (; posted < end && posted < u + window && may_post(posted, u); ++posted) post_receive(posted);
    const RingSpan s = plan.Received(u);
    uint8_t* target = bytes + s.first * element;
    if (s.count) {
      if (u < P) {
        streams.scratch(u).waitRecv(call.left());
        reduce(target, target, scratch + static_cast<size_t>(u % window) * slot_bytes, s.count);
        // The last reduce-scatter step completes this rank's chunk: averaged once, here, so
        // every rank receives the same bits.
        if (u >= P - S && op == ReduceOp::kAvg) ScaleInPlace(target, s.count, data.dtype, avg_scale);
      } else {
        streams.data(u).waitRecv(call.left());
      }
    }
    // Message u + S forwards what just arrived: the partial sum one step on, the finished
    // chunk into the all-gather, or the gathered chunk one more hop.
    if (u + S < end) send(u + S);
  }
  streams.WaitSends(call.left());
}

// The ring's phases on `data`. A failure other than a signature mismatch (found before any
// message touched the caller's data: RunOverlappedCheck) abandons the ring's pairs before it is
// reported.
void RunRing(const GlooCall& call, const RingMembers& ring, Buffer data, ReduceOp op, RingPhases phases,
             const RingPlan& plan, uint8_t* scratch) {
  const size_t slot_bytes = plan.max_segment() * ElementSize(data.dtype);
  RingStreams streams(call, scratch, slot_bytes * static_cast<size_t>(RingWindow(call.stream_count())), data);
  try {
    RunRingMessages(call, ring, data, op, phases, plan, scratch, streams);
  } catch (const MismatchError&) {
    throw;
  } catch (...) {
    streams.Abandon(call, ring.left, ring.right);
    throw;
  }
}

}  // namespace

RingMembers RingMembers::Of(const std::vector<int>& ranks, int rank) {
  const int m = static_cast<int>(ranks.size());
  const int index = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
  return {index, m, ranks[static_cast<size_t>((index + m - 1) % m)], ranks[static_cast<size_t>((index + 1) % m)]};
}

void RingAllreduce(const GlooCall& call, Buffer data, ReduceOp op) {
  const int n = call.context->size;
  const int rank = call.context->rank;
  RingAllreduceAmong(call, RingMembers{rank, n, (rank + n - 1) % n, (rank + 1) % n}, data, op, RingPhases::kBoth);
}

void RingAllreduceAmong(const GlooCall& call, const RingMembers& ring, Buffer data, ReduceOp op, RingPhases phases) {
  if (ring.size == 1 || data.count == 0) {
    RunCheck(call);
    return;
  }
  const RingPlan plan(ring.size, ring.index, data.count, ElementSize(data.dtype));
  const size_t scratch_bytes =
      plan.max_segment() * ElementSize(data.dtype) * static_cast<size_t>(RingWindow(call.stream_count()));
  WithRingSlots(call, scratch_bytes, [&](uint8_t* slots) { RunRing(call, ring, data, op, phases, plan, slots); });
}

}  // namespace gossipcc
