#include "algorithms/hierarchical_push_sum.h"

#include <utility>

namespace gossipcc {
namespace {

constexpr char kAlgorithm[] = "hierarchical_push_sum";

}  // namespace

HierarchicalPushSum::HierarchicalPushSum(std::shared_ptr<const PeerGraph> graph, MixingFn mixing, uint32_t tag)
    : across_(std::move(graph), std::move(mixing), tag), slices_(kAlgorithm) {}

void HierarchicalPushSum::Step(HostGroups& groups, const std::vector<Buffer>& buffers) {
  const int64_t step = across_.step();
  const double weight = across_.weight();
  try {
    // Push-sum across hosts on this rank's slice of the host's mean, carrying the host's weight.
    slices_.Round(groups, buffers, step, [&](Buffer slice) { across_.Step(*groups.across, {slice}); });
  } catch (...) {
    across_.Restore(step, weight);  // PushSum leaves both alone on its own errors; the all-gather's too
    throw;
  }
}

void HierarchicalPushSum::Debias(const Buffer& in, Buffer out) const { DebiasBuffer(kAlgorithm, weight(), in, out); }

}  // namespace gossipcc
