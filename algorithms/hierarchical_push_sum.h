// Push-sum over hosts (SGP on H hosts of G ranks): exact averaging inside each host, push-sum
// gossip between hosts, each host's G ranks carrying 1/G of the buffer across its NIC. A flat
// push-sum round sends a full buffer per rank, G per host NIC; this sends one per host.
//
// One round at step k, on the groups of HostGroups::Split (algorithms/host_slices.h):
//  1. reduce-scatter, averaging, inside the host: local rank i gets slice i of the host's mean;
//  2. a push-sum round (PushSum) on slice i among the H ranks with local rank i, over `graph`
//     (a graph for H ranks, one per host) at step k, carrying the host's weight;
//  3. all-gather inside the host: every rank of the host holds the host's new value.
// So the host values (the mean of each host's ranks, and one weight per host) follow push-sum
// over H nodes: conserved sum, and x / w converges to the average over all ranks on the
// graphs PushSum converges on. After a round every rank of a host holds the same bits and the
// same weight.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/host_slices.h"
#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "comm/core/types.h"
#include "comm/host_groups.h"

namespace gossipcc {

class HierarchicalPushSum {
 public:
  // `graph` has one node per host (world_size == the number of hosts). `mixing` null: uniform.
  explicit HierarchicalPushSum(std::shared_ptr<const PeerGraph> graph, MixingFn mixing = nullptr,
                               uint32_t tag = PushSum::kDefaultTag);

  // One round at step(), in place on `buffers` (together this rank's numerator x, as PushSum
  // takes it: CPU buffers of one dtype, float32, float64, float16 or bfloat16). Every rank calls
  // it with the same step and total count (else the comm layer's MismatchError, or PushSum's).
  // On error the buffers, weight() and step() are unchanged.
  void Step(HostGroups& groups, const std::vector<Buffer>& buffers);

  // out <- in / weight() (same count and dtype; out may equal in).
  void Debias(const Buffer& in, Buffer out) const;

  double weight() const { return across_.weight(); }
  int64_t step() const { return across_.step(); }
  // Checkpoint restore: the step counter and the host's push-sum weight (finite, > 0).
  void Restore(int64_t step, double weight) { across_.Restore(step, weight); }

 private:
  PushSum across_;  // on this rank's slice, among the ranks of its local rank
  HostSlices slices_;
};

}  // namespace gossipcc
