// The host half of a two-level gossip round on H hosts of G ranks (HostGroups::Split): the
// exact mean of the host's ranks is split in G slices, local rank i gossips slice i with the
// ranks of local rank i on the other hosts (one per host), and the host's ranks then share the
// new slices. Each host's NIC carries one copy of the buffer, split over its G ranks, instead of
// G copies.
//
// Round(groups, buffers, across):
//  1. reduce-scatter, averaging, inside the host: this rank gets slice `local_rank` of the
//     host's mean (the buffers concatenated, slices of ceil(count / G) elements, the last one
//     padded with zeros);
//  2. across(slice): the caller's gossip step on that slice, over groups.across;
//  3. all-gather inside the host; every rank of the host copies the host's new value into
//     `buffers`, the same bits on every one of them.
// The buffers are changed only when all three steps succeed; an error in step 3 comes after
// across() ran, so a caller whose step keeps state (a step counter, a weight) undoes it then.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/host_groups.h"
#include "comm/types.h"

namespace gossipcc {

class HostSlices {
 public:
  // `algorithm` names the caller in error messages.
  explicit HostSlices(const char* algorithm) : algorithm_(algorithm) {}

  // `buffers`: CPU buffers of one floating dtype (InvalidArgumentError otherwise, naming the
  // buffer). Every rank passes the same total count and dtype (else the comm layer's MismatchError).
  void Round(HostGroups& groups, const std::vector<Buffer>& buffers, const std::function<void(Buffer slice)>& across);

 private:
  const char* algorithm_;
  std::vector<uint64_t> padded_;  // G slices (8-byte words: aligned for every dtype)
  std::vector<uint64_t> slice_;
};

}  // namespace gossipcc
