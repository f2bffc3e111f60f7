// What both ring all-reduces share beyond RingPlan: kept receive slots, the overlapped check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "comm/gloo/call.h"

namespace gossipcc {

// ring(slots) on kept slots of `bytes`; if ring throws they go to call.retired.
void WithRingSlots(const GlooCall& call, size_t bytes, const std::function<void(uint8_t* slots)>& ring);

// If call.check is set: the header to the left neighbour; send_ahead() once the right one's
// header matches (only messages it posted receives for before its header left); the other
// headers; the verdict. On a mismatch drain(left_sent) first waits for the messages that did
// move (this rank's, and the left neighbour's iff left_sent), then every rank throws alike.
void RunOverlappedCheck(const GlooCall& call, int left, int right, const std::function<void()>& send_ahead,
                        const std::function<void(bool left_sent)>& drain);

}  // namespace gossipcc
