#include "algorithms/push_sum_membership.h"

#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "algorithms/peer_graph.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<char> Bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

}  // namespace

std::string LeftKey(int rank) { return absl::StrCat("ftps/left/", rank); }

bool HasLeft(Store& store, int rank) {
  try {
    store.wait({LeftKey(rank)}, std::chrono::milliseconds(1));
    return true;
  } catch (const TimeoutError&) {
    return false;
  }
}

void CheckGraphFitsSurvivors(const std::string& graph, int world_size) {
  for (int m = world_size; m >= 1; --m) {
    try {
      MakePeerGraph(graph, m);
    } catch (const InvalidArgumentError& e) {
      if (m == world_size) throw;
      throw InvalidArgumentError(absl::StrCat("fault_tolerant_push_sum: graph \"", graph, "\" fits ", world_size,
                                              " ranks but not the ", m,
                                              " a recovery may leave (it is re-derived over the survivors): ",
                                              e.what()));
    }
  }
}

std::vector<int> AgreeOnMembers(Store& store, int epoch, int rank, const std::vector<int>& members,
                                std::chrono::milliseconds window, std::chrono::milliseconds timeout) {
  const std::string prefix = absl::StrCat("ftps/", epoch, "/");
  store.set(absl::StrCat(prefix, "join/", rank), Bytes("1"));
  std::vector<bool> joined(members.size(), false);
  std::vector<bool> left(members.size(), false);  // no need to wait for a rank that left
  const auto deadline = Clock::now() + window;
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < members.size(); ++i) {
      if (joined[i] || left[i]) continue;
      if (members[i] != rank && HasLeft(store, members[i])) {
        left[i] = true;
        continue;
      }
      try {
        store.wait({absl::StrCat(prefix, "join/", members[i])}, std::chrono::milliseconds(1));
        joined[i] = true;
      } catch (const TimeoutError&) {
        all = false;
      }
    }
    if (all || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<int> view;
  for (size_t i = 0; i < members.size(); ++i) {
    if (joined[i]) view.push_back(members[i]);
  }
  const std::string mine = absl::StrJoin(view, ",");
  store.set(absl::StrCat(prefix, "view/", rank), Bytes(mine));
  // Everyone in the view joined within this rank's window, so each publishes its view at
  // most one window after this rank did.
  for (int r : view) {
    if (r == rank) continue;
    std::vector<char> v;
    try {
      v = store.get(absl::StrCat(prefix, "view/", r), 2 * window + timeout);
    } catch (const TimeoutError& e) {
      throw PeerError(absl::StrCat("fault_tolerant_push_sum on rank ", rank, ": recovery of epoch ", epoch,
                                   ": rank ", r, " joined but published no membership view (", e.what(), ")"));
    }
    const std::string theirs(v.begin(), v.end());
    if (theirs != mine) {
      throw PeerError(absl::StrCat("fault_tolerant_push_sum on rank ", rank, ": recovery of epoch ", epoch,
                                   ": survivors disagree on the membership: this rank saw {", mine, "}, rank ", r,
                                   " saw {", theirs, "}",
                                   theirs.find(absl::StrCat(rank)) == std::string::npos
                                       ? " (this rank joined after the others closed the epoch and was dropped)"
                                       : " (a rank joined at the very end of the join window)"));
    }
  }
  return view;
}

}  // namespace gossipcc
