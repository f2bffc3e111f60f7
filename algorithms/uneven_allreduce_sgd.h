// All-reduce SGD with uneven step counts, torch-distlearn's AllReduceSGD (docs/gossip.md): each
// step's gradients are averaged over the ranks that contributed to it, in one all-reduce with two
// trailing counters (float16/bfloat16 reduced in float32); a finished rank joins with zeros until
// every rank is done. At the end "the node with the most steps wins": every rank takes, bit for
// bit, the parameters of the rank with the most steps since the last synchronisation.
//
//   for (each local batch) { compute grads; sgd.SumAndNormalizeGradients(comm, grads); step; }
//   while (sgd.JoinUntilAllDone(comm, grads)) {}   // grads: same sizes, used as scratch
//   sgd.SynchronizeParameters(comm, params);       // every rank: the winner's params
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "comm/core/types.h"

namespace gossipcc {

class UnevenAllReduceSGD {
 public:
  struct StepResult {
    int contributors = 0;     // ranks that contributed gradients to this collective
    int still_training = 0;   // ranks that had not finished when they joined it
  };

  // Collective: grads <- (sum over contributors) / contributors. One float dtype and device; the
  // same total size on every rank (else MismatchError).
  StepResult SumAndNormalizeGradients(Communicator& comm, std::vector<Buffer> grads);

  // Collective, for a finished rank: joins with zeros (grads: scratch of the same sizes). True
  // while some rank still trains; every rank gets false from the same collective.
  bool JoinUntilAllDone(Communicator& comm, std::vector<Buffer> grads);

  // Collective, after JoinUntilAllDone returned false: params <- the Winner()'s params (its
  // bits, on every rank); resets steps_since_sync and returns the winner.
  int SynchronizeParameters(Communicator& comm, std::vector<Buffer> params);

  // For steps since the last synchronisation per rank: the most steps, the highest rank among
  // ties, 0 when all are 0. InvalidArgumentError for an empty list or a negative count.
  static int Winner(const std::vector<int64_t>& steps_per_rank);

  int64_t steps_contributed() const { return steps_contributed_; }  // since construction
  int64_t collectives() const { return collectives_; }              // since construction
  int64_t steps_since_sync() const { return steps_since_sync_; }    // decides the winner
  // Checkpoint restore; needs 0 <= steps_since_sync <= steps_contributed <= collectives.
  void Restore(int64_t steps_contributed, int64_t collectives, int64_t steps_since_sync);

 private:
  StepResult Run(Communicator& comm, std::vector<Buffer>& grads, bool contribute);
  int64_t steps_contributed_ = 0;
  int64_t collectives_ = 0;
  int64_t steps_since_sync_ = 0;
};

}  // namespace gossipcc
