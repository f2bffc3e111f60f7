// FaultTolerantPushSum's membership: the survivors' agreement on who is left, through the store
// alone (docs/reliability.md, "Dropping a dead peer"), and the check that the graph fits every
// membership a recovery can leave.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/core/store.h"

namespace gossipcc {

// InvalidArgumentError unless the MakePeerGraph spec fits `world_size` and every smaller size.
void CheckGraphFitsSurvivors(const std::string& graph, int world_size);

// The key a rank leaving on purpose sets (FaultTolerantPushSum::Leave); whether `rank` has.
std::string LeftKey(int rank);
bool HasLeft(Store& store, int rank);

// Epoch `epoch`'s agreement among `members` (original ranks, ascending): join, wait for every
// member (or its leave) up to `window`, publish the set seen, read every view in it. Returns the
// set when all views are equal; PeerError when they differ, one is missing, or it lacks `rank`.
std::vector<int> AgreeOnMembers(Store& store, int epoch, int rank, const std::vector<int>& members,
                                std::chrono::milliseconds window, std::chrono::milliseconds timeout);

}  // namespace gossipcc
