// Push-sum over hosts (SGP on H hosts of G ranks, on HostGroups::Split's groups): exact averaging
// inside each host, PushSum between hosts with each of its G ranks carrying 1/G of the buffer
// (algorithms/host_slices.h), so a host NIC carries one buffer per round instead of G. The host
// values (the mean of its ranks, one weight per host) follow push-sum over H nodes on `graph`:
// the sum is conserved, and x / w converges to the average over all ranks wherever PushSum
// converges. After a round every rank of a host holds the same bits and the same weight.
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
