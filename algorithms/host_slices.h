// The host half of a two-level gossip round on H hosts of G ranks (HostGroups::Split): the
// exact mean of the host's ranks is split in G slices, local rank i gossips slice i with the
// ranks of local rank i on the other hosts (one per host), and the host's ranks then share the
// new slices. Each host's NIC carries one copy of the buffer, split over its G ranks, instead of
// G copies.
//
// Round(groups, buffers, step, across):
//  0. the host's ranks check that they agree on the element count, dtype and step (an
//     all-gather inside the host; MismatchError on every rank of the host, naming each);
//  1. reduce-scatter, averaging, inside the host: this rank gets slice `local_rank` of the
//     host's mean (the buffers concatenated, slices of ceil(count / G) elements, the last one
//     padded with zeros);
//  2. across(slice): the caller's gossip step on the slice's elements of the buffer (the last
//     slices shorter or empty: not the padding), over groups.across;
//  3. the host's ranks agree that every step 2 succeeded (an all-gather of one flag): if one
//     failed, it raises its own error and the others a CommError naming it;
//  4. all-gather inside the host; every rank of the host copies the host's new value into
//     `buffers`, the same bits on every one of them.
// The buffers are changed only when every step succeeds. Step 2 may have succeeded on this
// rank when the round fails (in step 3 or 4): a caller whose step keeps state (a step counter,
// a weight) undoes it then. Hosts whose counts differ fail in step 2, where the slices' sizes
// differ (the last local rank's at least), and every rank of those hosts then in step 3.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/core/types.h"
#include "comm/host_groups.h"

namespace gossipcc {

class HostSlices {
 public:
  // `algorithm` names the caller in error messages.
  explicit HostSlices(const char* algorithm) : algorithm_(algorithm) {}

  // `buffers`: CPU buffers of one floating dtype (InvalidArgumentError otherwise, naming the
  // buffer). Every rank passes the same total count, dtype and `step` (the caller's round).
  void Round(HostGroups& groups, const std::vector<Buffer>& buffers, int64_t step,
             const std::function<void(Buffer slice)>& across);

 private:
  const char* algorithm_;
  std::vector<uint64_t> padded_;  // G slices (8-byte words: aligned for every dtype)
  std::vector<uint64_t> slice_;
};

}  // namespace gossipcc
