#include "comm/gloo/packed_ring_allreduce.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "comm/core/errors.h"
#include "comm/core/reduce.h"
#include "comm/gloo/float32_packing.h"
#include "comm/gloo/posted_buffers.h"
#include "comm/gloo/ring_common.h"
#include "comm/gloo/ring_plan.h"
#include "comm/gloo/slots.h"

namespace gossipcc {
namespace {

// A send is packed and issued once the receive kSendsAhead messages before it has been
// consumed, so at most that many sends (plus those still draining) hold a send slot.
constexpr int kSendsAhead = kRingWindow;
// Message u is packed into send slot u % kSendSlots, after the send of message u - kSendSlots
// has completed. With kSendSlots >= kSendsAhead + kRingWindow that wait never closes a cycle:
// the right neighbour posted its receive for message u - kSendSlots once it had consumed
// message u - kSendSlots - kRingWindow, which needs nothing from this rank beyond sends it
// already issued; so some rank can always make progress.
constexpr int kSendSlots = kSendsAhead + kRingWindow;

struct Layout {
  size_t unpacked_bytes;  // one segment, unpacked (the reduce-scatter's staging)
  size_t slot_bytes;      // one packed segment
  size_t total() const { return unpacked_bytes + (kRingWindow + kSendSlots) * slot_bytes; }
};

Layout LayoutFor(const RingPlan& plan) {
  return {plan.max_segment() * 4, PackedFloat32Bound(plan.max_segment())};
}

const char* Phase(int u, int P) { return u < P ? "reduce-scatter" : "all-gather"; }

// One call's packed ring over `scratch` (LayoutFor(plan).total() bytes): message u lands in
// receive slot u % kRingWindow and leaves from send slot u % kSendSlots. Each slot is its own
// Gloo buffer, so that a wait names exactly the message that slot holds.
class PackedRing {
 public:
  PackedRing(const GlooCall& call, Buffer data, ReduceOp op, const RingPlan& plan, uint8_t* scratch)
      : call_(call),
        ctx_(*call.context),
        right_((ctx_.rank + 1) % ctx_.size),
        left_((ctx_.rank + ctx_.size - 1) % ctx_.size),
        dtype_(data.dtype),
        op_(op),
        plan_(plan),
        reduce_(GetReduceFn(data.dtype, op)),
        slot_(MakeSlot(kPackedRingAllreduceSlotPrefix, call.tag)),
        values_(static_cast<uint32_t*>(data.data)),
        layout_(LayoutFor(plan)),
        scratch_(scratch),
        unpacked_(reinterpret_cast<uint32_t*>(scratch)),
        ahead_(std::min(plan.segments(), kSendsAhead)),
        buffers_(ctx_, *call.retired) {
    for (int i = 0; i < kRingWindow; ++i) recv_ub_[i] = &buffers_.Create(RecvSlot(i), layout_.slot_bytes);
    for (int i = 0; i < kSendSlots; ++i) send_ub_[i] = &buffers_.Create(SendSlot(i), layout_.slot_bytes);
  }

  // Before the verdict: receives only into slots, and only sends of messages the right
  // neighbour posted receives for before its signature left (its first kRingWindow).
  void StartWithCheck() {
    const int first_receives = std::min(kRingWindow, plan_.phase_messages());
    for (; posted_ < first_receives; ++posted_) PostReceive(posted_);
    RunOverlappedCheck(
        call_, left_, right_, [this] { SendAhead(); },
        [this](bool left_sent) {
          WaitSends();
          if (left_sent) {
            for (int u = 0; u < ahead_; ++u) {
              if (plan_.Received(u).count) recv_ub_[u % kRingWindow]->waitRecv(call_.left());
            }
          }
        });
    SendAhead();
  }

  // Step u of the ring: the receives the window allows, message u consumed, then the sends
  // it frees (message w forwards what message w - S brought; w - S <= u: consumed).
  void Step(int u) {
    // Slot u % kRingWindow is reused by message u + kRingWindow only once message u is unpacked.
    for (; posted_ < plan_.messages() && posted_ < u + kRingWindow; ++posted_) PostReceive(posted_);
    Consume(u);
    for (; sent_ < plan_.messages() && sent_ <= u + ahead_; ++sent_) Send(sent_);
  }

  // Waits for every send that still holds a slot.
  void WaitSends() {
    for (int i = 0; i < kSendSlots; ++i) WaitSendSlot(i);
  }

 private:
  uint8_t* RecvSlot(int i) const {
    return scratch_ + layout_.unpacked_bytes + static_cast<size_t>(i) * layout_.slot_bytes;
  }
  uint8_t* SendSlot(int i) const { return RecvSlot(kRingWindow + i); }

  void PostReceive(int u) {
    if (plan_.Received(u).count == 0) return;
    recv_ub_[u % kRingWindow]->recv(left_, slot_, 0, layout_.slot_bytes);
  }

  void WaitSendSlot(int i) {
    if (!send_pending_[i]) return;
    send_ub_[i]->waitSend(call_.left());
    send_pending_[i] = false;
  }

  // The first messages, up to ahead_: those the right neighbour posted receives for first.
  void SendAhead() {
    for (; sent_ < ahead_; ++sent_) Send(sent_);
  }

  // Packs what message u carries from the buffer as it is now: a segment of this rank's own
  // chunk (reduce-scatter step 0), a partial sum one step on, or a finished segment.
  void Send(int u) {
    const RingSpan s = plan_.Sent(u);
    if (s.count == 0) return;
    const int i = u % kSendSlots;
    WaitSendSlot(i);
    const size_t bytes = PackFloat32(absl::MakeConstSpan(values_ + s.first, s.count), SendSlot(i));
    send_ub_[i]->send(right_, slot_, 0, bytes);
    send_pending_[i] = true;
    call_.scratch->packed_raw_bytes.fetch_add(s.count * 4, std::memory_order_relaxed);
    call_.scratch->packed_wire_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }

  // Waits for message u and adds it into the buffer (reduce-scatter) or unpacks it in place
  // (all-gather).
  void Consume(int u) {
    const RingSpan s = plan_.Received(u);
    if (s.count == 0) return;
    recv_ub_[u % kRingWindow]->waitRecv(call_.left());
    uint32_t* target = values_ + s.first;
    const int P = plan_.phase_messages();
    if (u < P) {
      Unpack(u, unpacked_, s.count);
      reduce_(target, target, unpacked_, s.count);
      // The last reduce-scatter step completes this rank's chunk: averaged once, here, so
      // every rank receives the same bits.
      if (u >= P - plan_.segments() && op_ == ReduceOp::kAvg) {
        ScaleInPlace(target, s.count, dtype_, 1.0 / static_cast<double>(ctx_.size));
      }
    } else {
      Unpack(u, target, s.count);
    }
  }

  void Unpack(int u, uint32_t* out, size_t count) {
    const absl::Status status =
        UnpackFloat32(absl::MakeConstSpan(RecvSlot(u % kRingWindow), layout_.slot_bytes), absl::MakeSpan(out, count));
    if (!status.ok()) {
      throw CommError(absl::StrCat("packed ring all-reduce on rank ", ctx_.rank, ": ",
                                   Phase(u, plan_.phase_messages()), " message ", u, " from rank ", left_,
                                   " is malformed: ", status.message()));
    }
  }

  const GlooCall& call_;
  gloo::Context& ctx_;
  const int right_;
  const int left_;
  const DType dtype_;
  const ReduceOp op_;
  const RingPlan& plan_;
  const ReduceFn reduce_;
  const uint64_t slot_;
  uint32_t* const values_;
  const Layout layout_;
  uint8_t* const scratch_;
  uint32_t* const unpacked_;  // the reduce-scatter's staging, at the start of scratch
  const int ahead_;           // message u + ahead_ is sent once message u is consumed
  PostedBuffers buffers_;
  std::array<gloo::transport::UnboundBuffer*, kRingWindow> recv_ub_;
  std::array<gloo::transport::UnboundBuffer*, kSendSlots> send_ub_;
  std::array<bool, kSendSlots> send_pending_{};
  int posted_ = 0;  // receives posted: messages [0, posted_)
  int sent_ = 0;    // sends issued: messages [0, sent_)
};

void RunPackedRing(const GlooCall& call, Buffer data, ReduceOp op, const RingPlan& plan, uint8_t* scratch) {
  PackedRing ring(call, data, op, plan, scratch);
  ring.StartWithCheck();
  for (int u = 0; u < plan.messages(); ++u) ring.Step(u);
  ring.WaitSends();
}

}  // namespace

void PackedRingAllreduce(const GlooCall& call, Buffer data, ReduceOp op) {
  const int n = call.context->size;
  if (n == 1 || data.count == 0) {
    RunCheck(call);
    return;
  }
  const RingPlan plan(n, call.context->rank, data.count, 4);
  WithRingSlots(call, LayoutFor(plan).total(),
                [&](uint8_t* slots) { RunPackedRing(call, data, op, plan, slots); });
}

}  // namespace gossipcc
