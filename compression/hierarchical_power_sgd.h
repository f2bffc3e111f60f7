// PowerSGD on H hosts of G ranks, compressed only across hosts: the gradients are averaged
// exactly inside each host, each tensor's PowerSGD step (its P and Q all-reduces) runs once per
// host, on one of the host's ranks, among the H ranks with that local rank, and the host's
// ranks then share the results. Each host's NIC carries one set of factors instead of G.
//
// One call (every rank of the parent communicator, the same tensors):
//  1. each tensor is copied aside and averaged over the host's ranks (exact all-reduces inside
//     the host);
//  2. each tensor goes to the local rank its key hashes to (LocalRankOfKey: the same on every
//     rank and in every call, so a key's state stays on one rank whatever else a call holds):
//     local rank i runs `across`'s AllReduce on its tensors among the ranks with local rank i,
//     one per host, over H hosts;
//  3. the host's ranks agree that every local rank's step succeeded (an all-gather of one flag);
//  4. each tensor is broadcast inside the host from the local rank that ran it, and copied back.
// So every rank gets the result of PowerSGD over H nodes whose gradients are the host means
// (the same bits on every rank of a host, and on every host), its error bound and optimum
// included. `across` holds the state (error feedback, Q, step counts) of the keys this rank
// runs, only those: checkpoints are per rank (each rank saves and restores its own) and restore
// onto the same number of ranks per host. On any error the
// tensors are unchanged and every rank of the host raises: the failed rank its own error, the
// others a CommError naming it; the keys of a local rank whose step succeeded on every host
// keep their advanced state (their across group is consistent).
#pragma once

#include <string>

#include "absl/types/span.h"
#include "comm/host_groups.h"
#include "compression/power_sgd.h"

namespace gossipcc {
namespace compression {

PowerSGDStats HierarchicalPowerSGDAllReduce(PowerSGD& across, HostGroups& groups,
                                            absl::Span<const GradientTensor> tensors);

// Step 2's deal: the local rank (of `ranks`) that runs the tensor of this key.
int LocalRankOfKey(const std::string& key, int ranks);

}  // namespace compression
}  // namespace gossipcc
