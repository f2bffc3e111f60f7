// The quantized all-reduce's last step for a buffer of more than kQuantizedEagerBytes quantized
// (compression/quantized_allreduce.h): a ring all-gather of the owners' quantized sums, each
// piece dequantized into the caller's data once it is here. Internal to compression/.
#pragma once

#include "compression/quantized_plan.h"

namespace gossipcc {
namespace quantized_internal {

// At step g = 1..n-1 of a slice a rank receives owner (me - g)'s pieces from its left neighbour
// and sends owner (me - g + 1)'s to its right one: its own at step 1, then each piece it
// received at step g - 1 as soon as that piece is here. Both ends number the messages alike
// (slice, step, piece) and post them in that order, as the point-to-point layer matches them.
// Precondition: every scatter round is done and this rank's own sums are quantized in
// call.quantized. On return every element of call.x holds the result; on a failure every
// message posted was waited for before the error is rethrown.
void RingGather(QuantizedCall& call);

}  // namespace quantized_internal
}  // namespace gossipcc
