// MassLedger: FaultTolerantPushSum's mass accounting (docs/reliability.md, "Mass"): per peer, in
// float64, what this rank sent and received since the last recovery and the net flow since the
// start, and the corrections a recovery derives from them.
#pragma once

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

namespace gossipcc {

class MassLedger {
 public:
  // A round's `words` values (x, then w) sent to / received from `peer`.
  void Sent(int peer, const double* mass, size_t words);
  void Received(int peer, const double* mass, size_t words);

  // Forgets `peer` (a rank that left on purpose): its net flow is not undone later.
  void Forget(int peer) { net_.erase(peer); }

  // What was sent to each peer since the last recovery, by original rank.
  const std::map<int, std::vector<double>>& sent() const { return sent_; }

  // A recovery's corrections to add to x, then w: + net[d] per dead d, + what each survivor sent
  // this rank (`sent_to_me`), - what this rank received from it (settled into net[j] too); the
  // records since the last recovery are then cleared.
  std::vector<double> Settle(const std::vector<int>& dead,
                             const std::vector<std::pair<int, std::vector<double>>>& sent_to_me,
                             const std::vector<int>& survivors, size_t words);

 private:
  std::map<int, std::vector<double>> sent_, recv_, net_;
};

}  // namespace gossipcc
