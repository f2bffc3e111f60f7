#include "algorithms/hierarchical_symmetric_gossip.h"

#include <utility>

namespace gossipcc {

HierarchicalSymmetricGossip::HierarchicalSymmetricGossip(std::shared_ptr<const PeerGraph> graph, uint32_t tag)
    : across_(std::move(graph), tag), slices_("hierarchical_symmetric_gossip") {}

void HierarchicalSymmetricGossip::Step(HostGroups& groups, const std::vector<Buffer>& buffers) {
  const int64_t step = across_.step();
  try {
    // D-PSGD across hosts on this rank's slice of the host's mean.
    slices_.Round(groups, buffers, step, [&](Buffer slice) { across_.Step(*groups.across, {slice}); });
  } catch (...) {
    across_.Restore(step);  // SymmetricGossip leaves it alone on its own errors; the all-gather's too
    throw;
  }
}

}  // namespace gossipcc
