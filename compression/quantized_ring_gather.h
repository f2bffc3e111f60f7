// Internal: the quantized all-reduce's last step above kQuantizedEagerBytes quantized, a ring
// all-gather of the owners' quantized sums, each piece dequantized into call.x once it is here.
#pragma once

#include "compression/quantized_plan.h"

namespace gossipcc {
namespace quantized_internal {

// Needs every scatter round done and this rank's own sums quantized in call.quantized. Fills all
// of call.x with the result; on failure waits for every posted message, then rethrows.
void RingGather(QuantizedCall& call);

}  // namespace quantized_internal
}  // namespace gossipcc
