// Symmetric gossip over hosts (D-PSGD on H hosts of G ranks, on HostGroups::Split's groups): exact
// averaging inside each host, SymmetricGossip between hosts with each of its G ranks carrying 1/G
// of the buffer (algorithms/host_slices.h), so a host NIC carries one buffer per neighbour instead
// of G. The host values (the mean of its ranks) follow D-PSGD over H nodes on `graph` with its
// Metropolis weights: x <- W_k x, W_k doubly stochastic, the average over all ranks conserved
// and, on connected graphs, reached. After a round every rank of a host holds the same bits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/host_slices.h"
#include "algorithms/peer_graph.h"
#include "algorithms/symmetric_gossip.h"
#include "comm/core/types.h"
#include "comm/host_groups.h"

namespace gossipcc {

class HierarchicalSymmetricGossip {
 public:
  // `graph` has one node per host (world_size == the number of hosts).
  explicit HierarchicalSymmetricGossip(std::shared_ptr<const PeerGraph> graph,
                                       uint32_t tag = SymmetricGossip::kDefaultTag);

  // One round at step(), in place on `buffers` (CPU buffers of one floating dtype). Every rank
  // calls it with the same step and total count (else the comm layer's MismatchError, or
  // SymmetricGossip's). On error the buffers and step() are unchanged.
  void Step(HostGroups& groups, const std::vector<Buffer>& buffers);

  int64_t step() const { return across_.step(); }
  void Restore(int64_t step) { across_.Restore(step); }
  const PeerGraph& graph() const { return across_.graph(); }

 private:
  SymmetricGossip across_;  // on this rank's slice, among the ranks of its local rank
  HostSlices slices_;
};

}  // namespace gossipcc
