// MassLedger: FaultTolerantPushSum's mass accounting (fault_tolerant_push_sum.h, "Mass
// accounting"). Per peer (original rank), in float64, the mass (x elements, then w) this rank
// sent and received since the last recovery, and the net flow (sent - received) since the
// start; and the corrections a recovery derives from them, which make the survivors' mass
// what it would be had the dead never taken part.
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

  // A recovery's corrections (`words` values, to add to x, then w): + net[d] for every peer
  // in `dead` (then forgotten), + what each survivor j sent this rank since the last recovery
  // (`sent_to_me`: (original rank, its record)), - what this rank received from each of
  // `survivors` (original ranks, this rank excluded); the last two are settled in net[j] too,
  // so that a later death of j undoes them. Added in that order (the same bits on every run).
  // The records since the last recovery are cleared.
  std::vector<double> Settle(const std::vector<int>& dead,
                             const std::vector<std::pair<int, std::vector<double>>>& sent_to_me,
                             const std::vector<int>& survivors, size_t words);

 private:
  std::map<int, std::vector<double>> sent_, recv_, net_;
};

}  // namespace gossipcc
