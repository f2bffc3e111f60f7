// Membership for FaultTolerantPushSum: the survivors' agreement on who is left after a failure
// (the protocol is in fault_tolerant_push_sum.h, "Agreement"), through the store alone, since
// the communicator is what failed; and the check that the peer graph fits every membership a
// recovery can leave.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/store.h"

namespace gossipcc {

// Throws InvalidArgumentError unless the MakePeerGraph spec `graph` fits `world_size` ranks and
// every smaller size a recovery can leave (it is re-derived over the survivors): a spec that
// only fits the full world (an edge list naming rank n-1, say) is refused at creation, not
// after a death.
void CheckGraphFitsSurvivors(const std::string& graph, int world_size);

// The store key a rank that leaves on purpose sets (FaultTolerantPushSum::Leave), and whether
// `rank` has set it.
std::string LeftKey(int rank);
bool HasLeft(Store& store, int rank);

// Epoch `epoch`'s agreement, run by original rank `rank`, one of `members` (original ranks,
// ascending): writes ftps/<epoch>/join/<rank>, waits until every member has joined (or left:
// HasLeft) or `window` has passed, publishes the set it saw (ftps/<epoch>/view/<rank>) and reads the view of every
// rank in it, each within 2 * window + `timeout`. Returns that set (ascending) when every view
// is equal; throws PeerError when views differ, a rank in the set published none, or the set
// lacks this rank (it joined after the others closed the epoch).
std::vector<int> AgreeOnMembers(Store& store, int epoch, int rank, const std::vector<int>& members,
                                std::chrono::milliseconds window, std::chrono::milliseconds timeout);

}  // namespace gossipcc
