// What the two ring all-reduces (ring_allreduce.h, packed_ring_allreduce.h) share beyond
// their RingPlan: the communicator's kept receive slots, and their share of the signature
// check, overlapped with the first messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "comm/gloo_call.h"

namespace gossipcc {

// Calls ring(slots) with call.scratch->ring grown to at least `bytes`, kept between calls (a
// fresh allocation would fault its pages in on every call). If ring throws, the slots go to
// call.retired instead, since a receive or send may still be posted on them, and the next call
// allocates anew.
void WithRingSlots(const GlooCall& call, size_t bytes, const std::function<void(uint8_t* slots)>& ring);

// The overlapped signature check (ring_allreduce.h), if call.check is set: this rank's header
// to its left neighbour first; send_ahead() as soon as the right neighbour's header is in and
// matches (it must send only messages that neighbour posted receives for before its header
// left); the remaining headers; then the verdict. On a mismatch every rank fails alike:
// drain(left_sent) first waits for the messages that did move (this rank's own, and its left
// neighbour's first ones, which it sent exactly when left_sent, by the same rule), so that
// none is still in flight when the MismatchError leaves.
void RunOverlappedCheck(const GlooCall& call, int left, int right, const std::function<void()>& send_ahead,
                        const std::function<void(bool left_sent)>& drain);

}  // namespace gossipcc
