#include "compression/quantized_ring_gather.h"

#include <deque>
#include <limits>
#include <memory>
#include <vector>

#include "compression/quantized_blocks.h"

namespace gossipcc {
namespace quantized_internal {
namespace {

constexpr size_t kOwn = std::numeric_limits<size_t>::max();

// The ring's messages in the order both ends post them: what this rank receives from its left
// neighbour, what it sends to its right one, and per send the receive whose piece it forwards
// (kOwn: one of this rank's own pieces).
struct RingMessages {
  std::vector<Piece> receives, sends;
  std::vector<size_t> forwards;
};

// At step g = 1..n-1 of a slice a rank receives owner (me - g)'s pieces from its left neighbour
// and sends owner (me - g + 1)'s to its right one: its own at step 1, then each piece received at
// step g - 1. Both ends number the messages alike (slice, step, piece) and post them in that order.
RingMessages PlanRing(const QuantizedCall& call) {
  const int n = call.n, me = call.me;
  RingMessages m;
  for (const Slice& sl : call.slices) {
    size_t previous_step = kOwn;  // the index of step g - 1's first receive
    for (int g = 1; g < n; ++g) {
      const std::vector<Piece> out = PiecesOf(sl, (me - g + 1 + n) % n, call.count, call.bits, call.block);
      for (size_t j = 0; j < out.size(); ++j) {
        m.sends.push_back(out[j]);
        m.forwards.push_back(g == 1 ? kOwn : previous_step + j);
      }
      previous_step = m.receives.size();
      for (const Piece& p : PiecesOf(sl, (me - g + n) % n, call.count, call.bits, call.block)) m.receives.push_back(p);
    }
  }
  return m;
}

// Every message comes from the left neighbour (one stream on this host's downlink), so receives
// are posted a few ahead; sends are posted in order, each once its piece is here, a few at a
// time. No deadlock: a send waits only for an earlier message from the left neighbour, and the
// right one keeps its receives posted in the same order.
class Ring {
 public:
  Ring(QuantizedCall& call, RingMessages messages)
      : call_(call), m_(std::move(messages)), right_((call.me + 1) % call.n), left_((call.me + call.n - 1) % call.n) {}

  void Run() {
    try {
      PostReadySends();
      // This rank's own sums, while its first pieces are on the wire.
      for (const Slice& sl : call_.slices) {
        for (const Piece& p : PiecesOf(sl, call_.me, call_.count, call_.bits, call_.block)) Decode(p);
      }
      while (arrived_ < m_.receives.size()) ReceiveOne();
      // The sends left (all of them are ready now that every piece is here).
      while (!sends_.empty()) {
        sends_.front()->wait();
        sends_.pop_front();
        PostReadySends();
      }
    } catch (...) {
      WaitForEveryPosted();
      throw;
    }
  }

 private:
  void PostReadySends() {
    for (; next_send_ < m_.sends.size() && sends_.size() < kQuantizedGatherInFlight &&
           (m_.forwards[next_send_] == kOwn || m_.forwards[next_send_] < arrived_);
         ++next_send_) {
      const Piece& p = m_.sends[next_send_];
      call_.stats.bytes_sent += p.byte1 - p.byte0;
      sends_.push_back(call_.comm.p2p(
          {P2POp::Send(CpuBuffer(call_.quantized + p.byte0, p.byte1 - p.byte0), right_, kQuantizedAllreduceTag)}));
    }
  }

  // Keeps receives posted ahead, waits for the next one, forwards and decodes its piece.
  void ReceiveOne() {
    for (; next_receive_ < m_.receives.size() && next_receive_ < arrived_ + kQuantizedGatherInFlight; ++next_receive_) {
      const Piece& p = m_.receives[next_receive_];
      receives_.push_back(call_.comm.p2p(
          {P2POp::Recv(CpuBuffer(call_.quantized + p.byte0, p.byte1 - p.byte0), left_, kQuantizedAllreduceTag)}));
    }
    receives_.front()->wait();
    receives_.pop_front();
    ++arrived_;
    PostReadySends();
    Decode(m_.receives[arrived_ - 1]);
    while (!sends_.empty() && sends_.front()->is_completed()) {
      sends_.front()->wait();  // (rethrows a failed send)
      sends_.pop_front();
    }
    PostReadySends();
  }

  void Decode(const Piece& p) {
    DequantizeRange(call_.quantized + p.byte0, p.elem1 - p.elem0, call_.bits, call_.block, call_.x + p.elem0,
                    /*add=*/false);
  }

  // Every posted message is waited for before the caller's buffers go.
  void WaitForEveryPosted() {
    for (auto* queue : {&receives_, &sends_}) {
      for (auto& w : *queue) {
        try {
          w->wait();
        } catch (...) {
        }
      }
    }
  }

  QuantizedCall& call_;
  const RingMessages m_;
  const int right_, left_;
  std::deque<std::shared_ptr<Work>> receives_, sends_;
  size_t arrived_ = 0, next_receive_ = 0, next_send_ = 0;
};

}  // namespace

void RingGather(QuantizedCall& call) { Ring(call, PlanRing(call)).Run(); }

}  // namespace quantized_internal
}  // namespace gossipcc
