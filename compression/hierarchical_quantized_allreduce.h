// The quantized all-reduce (compression/quantized_allreduce.h) on H hosts of G ranks, compressed only
// across hosts: exact inside the host, one quantized copy of the data per host NIC, carried by
// the host's G ranks in parallel. The flat form sends every rank's quantized buffer over its
// host's NIC, G copies per host.
//
// On the groups of HostGroups::Split:
//  1. the check: every rank's header, gathered inside the host and then across hosts, so that
//     every rank judges all of them and raises the same error before anything moves;
//  2. reduce-scatter inside the host (exact float32 sum, or mean for kAvg): local rank i gets
//     slice i of the host's value, slices of whole blocks (ceil(count / G) rounded up to the
//     block size; the last ones short or empty);
//  3. QuantizedAllreduce of that slice among the H ranks with local rank i, one per host;
//  4. all-gather inside the host.
// Guarantees: bitwise the same result on every rank (one quantized all-reduce makes each slice,
// and the host all-gather copies it); within QuantizedAllreduceErrorBound(bits, H, s, op) of the
// exact result, s the sum over hosts of the block maxima of the host values (their sums, or
// their means for kAvg); a NaN or infinity on any rank makes its block NaN everywhere. The
// residuals (float32, data.count each, as QuantizedAllreduce takes them) keep the error of the
// elements this rank quantizes, those of its slice; the rest of them stays untouched.
// Every host must have as many ranks (HostGroups::Split). One call at a time per HostGroups, in
// the same order on every rank. On a transport failure part-way the data is unchanged, and so
// are the residuals unless it came in step 4, after step 3 updated them.
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
