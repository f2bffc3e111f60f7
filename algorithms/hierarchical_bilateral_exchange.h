// Bilateral exchange over hosts (synchronous AD-PSGD on H hosts of G ranks, on HostGroups::Split's
// groups): exact averaging inside each host, BilateralExchange between hosts with each of its G
// ranks carrying 1/G of the buffer (algorithms/host_slices.h), so a host NIC carries one buffer
// per exchange instead of G. The host values (the mean of its ranks) follow the bilateral
// exchange over H nodes: at each step the hosts paired by the matching (over hosts) average
// pairwise, an idle host keeps its value; the average over all ranks is conserved. After a step
// every rank of a host holds the same bits.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/bilateral_exchange.h"
#include "algorithms/host_slices.h"
#include "algorithms/peer_graph.h"
#include "comm/core/types.h"
#include "comm/host_groups.h"

namespace gossipcc {

class HierarchicalBilateralExchange {
 public:
  // The matching is over hosts: built-in (round robin; bipartite needs an even number of hosts)
  // or a graph with one node per host whose every step is a matching.
  explicit HierarchicalBilateralExchange(BilateralExchange::Matching matching = BilateralExchange::Matching::kRoundRobin,
                                         uint32_t tag = BilateralExchange::kDefaultTag);
  explicit HierarchicalBilateralExchange(std::shared_ptr<const PeerGraph> graph,
                                         uint32_t tag = BilateralExchange::kDefaultTag);

  // One exchange at step(), in place on `buffers` (CPU buffers of one floating dtype). Every
  // rank calls it with the same step and total count (else the comm layer's MismatchError, or
  // HostSlices'). On error the buffers and step() are unchanged.
  void Step(HostGroups& groups, const std::vector<Buffer>& buffers);

  int64_t step() const { return across_.step(); }
  void Restore(int64_t step) { across_.Restore(step); }
  // The host paired with `host` at `step` among `hosts` (-1: idle).
  int Partner(int host, int64_t step, int hosts) const { return across_.Partner(host, step, hosts); }

 private:
  BilateralExchange across_;  // on this rank's slice, among the ranks of its local rank
  HostSlices slices_;
};

}  // namespace gossipcc
