// Symmetric gossip over hosts (D-PSGD on H hosts of G ranks): exact averaging inside each host,
// D-PSGD (SymmetricGossip) between hosts, each host's G ranks carrying 1/G of the buffer across
// its NIC. A flat round sends a full buffer per rank and neighbour, G per host NIC; this sends one.
//
// One round at step k, on the groups of HostGroups::Split (algorithms/host_slices.h):
//  1. reduce-scatter, averaging, inside the host: local rank i gets slice i of the host's mean;
//  2. a symmetric gossip round on slice i among the H ranks with local rank i, over `graph` (an
//     undirected graph for H ranks, one per host) at step k, with its Metropolis weights;
//  3. all-gather inside the host: every rank of the host holds the host's new value.
// So the host values (the mean of each host's ranks) follow D-PSGD over H nodes: x <- W_k x with
// W_k doubly stochastic, the average over all ranks conserved and, on connected graphs,
// reached. After a round every rank of a host holds the same bits.
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
