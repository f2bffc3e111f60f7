// PowerSGD on H hosts of G ranks, compressed only across hosts: one set of factors per host NIC
// instead of G (docs/powersgd.md, "On hosts of several ranks").
#pragma once

#include <string>

#include "absl/types/span.h"
#include "comm/host_groups.h"
#include "compression/power_sgd.h"

namespace gossipcc {
namespace compression {

// Every rank of the parent passes the same CPU floating tensors and gets PowerSGD over H nodes
// whose gradients are the host means, the same bits on every rank. `across` keeps the state of
// only the keys this rank runs: checkpoints are per rank, restored onto as many ranks per host.
// On error the tensors are unchanged and every rank of the host raises (the failed one its own
// error, the others a CommError naming it); keys whose step succeeded on every host stay advanced.
PowerSGDStats HierarchicalPowerSGDAllReduce(PowerSGD& across, HostGroups& groups,
                                            absl::Span<const GradientTensor> tensors);

int LocalRankOfKey(const std::string& key, int ranks);  // who runs `key`: the same on every rank and call

}  // namespace compression
}  // namespace gossipcc
