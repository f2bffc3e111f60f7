// The quantized all-reduce's argument check (internal to compression/): every rank all-gathers a
// header of its arguments and its verdict on them, and judges the table alike, so a bad or
// mismatched argument raises the same error on every rank before anything is modified.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/core/types.h"
#include "compression/quantized_allreduce.h"

namespace gossipcc {
namespace quantized_internal {

// This rank's check header: its arguments and its verdict on them.
std::vector<int64_t> CheckHeader(Buffer data, const QuantizedAllreduceOptions& options,
                                 const QuantizedResidual& residual);

// Every rank's header, in rank order: throws InvalidArgumentError (a rank's invalid arguments,
// named) or MismatchError (another collective, or ranks that disagree), the same on every rank
// that judges the same table, naming ranks by their place in `table`.
void JudgeHeaders(const std::vector<int64_t>& table, int me, Buffer data, const QuantizedAllreduceOptions& options);

}  // namespace quantized_internal
}  // namespace gossipcc
