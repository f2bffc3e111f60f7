// QuantizedAllreduce on HostGroups::Split's groups, quantized only across hosts (one quantized
// copy per host NIC, not G). As the flat call over H nodes whose inputs are the host sums (means
// for kAvg): one error on every rank before anything moves, else the same bits everywhere, within
// QuantizedAllreduceErrorBound(bits, H, s, op), s the sum of the hosts' block maxima. Only this
// rank's slice of the residuals changes. One call at a time per HostGroups, in one order on every
// rank. A transport failure changes no data, and no residual unless in the closing all-gather.
#pragma once

#include "comm/core/types.h"
#include "comm/host_groups.h"
#include "compression/quantized_allreduce.h"

namespace gossipcc {

QuantizedAllreduceStats HierarchicalQuantizedAllreduce(HostGroups& groups, Buffer data,
                                                       const QuantizedAllreduceOptions& options,
                                                       QuantizedResidual residual = {},
                                                       QuantizedAllreduceScratch* scratch = nullptr);

}  // namespace gossipcc
