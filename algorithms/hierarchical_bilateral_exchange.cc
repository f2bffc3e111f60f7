#include "algorithms/hierarchical_bilateral_exchange.h"

#include <utility>

namespace gossipcc {

HierarchicalBilateralExchange::HierarchicalBilateralExchange(BilateralExchange::Matching matching, uint32_t tag)
    : across_(matching, tag), slices_("hierarchical_bilateral_exchange") {}

HierarchicalBilateralExchange::HierarchicalBilateralExchange(std::shared_ptr<const PeerGraph> graph, uint32_t tag)
    : across_(std::move(graph), tag), slices_("hierarchical_bilateral_exchange") {}

void HierarchicalBilateralExchange::Step(HostGroups& groups, const std::vector<Buffer>& buffers) {
  const int64_t step = across_.step();
  try {
    // The pairwise average across hosts on this rank's slice of the host's mean.
    slices_.Round(groups, buffers, step, [&](Buffer slice) { across_.Step(*groups.across, {slice}); });
  } catch (...) {
    across_.Restore(step);  // the exchange may have advanced before the host's agreement failed
    throw;
  }
}

}  // namespace gossipcc
