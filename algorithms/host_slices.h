// The host half of a two-level gossip round on H hosts of G ranks (HostGroups::Split): local rank
// i gossips slice i of its host's exact mean with local rank i of the other hosts, then the host's
// ranks share the new slices: one copy of the buffer per host NIC instead of G.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/core/types.h"
#include "comm/host_groups.h"

namespace gossipcc {

class HostSlices {
 public:
  explicit HostSlices(const char* algorithm) : algorithm_(algorithm) {}  // the caller, for errors

  // `buffers`: CPU buffers of one floating dtype (else InvalidArgumentError naming the buffer), of
  // the same total count and dtype and the same `step` on every rank (else MismatchError on every
  // rank of a host that disagrees; hosts that disagree fail in `across`). `across` runs the
  // caller's step over groups.across on this rank's slice of the host's mean (ceil(count / G)
  // elements, the last slices shorter or empty); if it fails on a rank, that rank raises its error
  // and the rest of its host a CommError naming it. `buffers` change only if every step succeeds,
  // to the same bits on every rank of the host. `across` may have succeeded here when the round
  // fails: a caller whose step keeps state (a counter, a weight) then undoes it.
  void Round(HostGroups& groups, const std::vector<Buffer>& buffers, int64_t step,
             const std::function<void(Buffer slice)>& across);

 private:
  const char* algorithm_;
  std::vector<uint64_t> padded_;  // G slices (8-byte words: aligned for every dtype)
  std::vector<uint64_t> slice_;
};

}  // namespace gossipcc
