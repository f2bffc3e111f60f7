// All-reduce SGD with uneven step counts (torch-distlearn's AllReduceSGD).
//
// Ranks may run different numbers of steps (uneven data shards). Each step's gradients are
// summed over the ranks that contributed this step and divided by how many did. A rank that
// has run out of steps keeps joining the same collective with zeros (and says it is done)
// until every rank is done. Every call is ONE all-reduce of the gradients plus two trailing
// counters (contributors, ranks still training), in float64 for float64 gradients and float32
// otherwise (float16/bfloat16 are widened, reduced in float32 and rounded once).
//
// At the end, as in torch-distlearn's synchronizeParameters, "the node with the most steps
// wins": the rank that contributed the most steps since the last synchronisation applied every
// averaged update of the epoch (a rank that stopped early missed the later ones), so every
// rank takes its parameters, bit for bit; nothing is averaged. Among ranks tied for the most
// steps the highest rank wins (torch-distlearn sorts the step counts ascending with Torch's
// sort, stable for up to 11 nodes, and takes the last index); when no rank contributed a step,
// rank 0 (torch-distlearn then scatters from the root). Ranks tied for the most steps applied
// the same updates, so with the same optimizer they hold the same parameters anyway.
//
//   UnevenAllReduceSGD sgd;
//   for (each local batch) { compute grads; sgd.SumAndNormalizeGradients(comm, grads); step; }
//   while (sgd.JoinUntilAllDone(comm, grads)) {}   // grads: same sizes, used as scratch
//   sgd.SynchronizeParameters(comm, params);       // every rank: the winner's params
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "comm/types.h"

namespace gossipcc {

class UnevenAllReduceSGD {
 public:
  struct StepResult {
    int contributors = 0;     // ranks that contributed gradients to this collective
    int still_training = 0;   // ranks that had not finished when they joined it
  };

  // Collective. This rank contributes `grads`; on return grads = (sum over contributors) /
  // contributors. Buffers: float32/float64/float16/bfloat16, one dtype and device, and every
  // rank's calls must have the same total size (MismatchError from the comm layer otherwise).
  StepResult SumAndNormalizeGradients(Communicator& comm, std::vector<Buffer> grads);

  // Collective, for a rank that has finished: joins with zeros and reports itself done.
  // `grads` (same sizes as the other ranks') receive the step's averaged gradient, which a
  // finished rank ignores. Returns true while some rank is still training: call it until it
  // returns false (all ranks then return false from the same collective).
  bool JoinUntilAllDone(Communicator& comm, std::vector<Buffer> grads);

  // Collective, once every rank's JoinUntilAllDone has returned false: one all-reduce of the
  // ranks' step counts since the last synchronisation, then params <- the winner's params
  // (Winner() of those counts), broadcast from it: every rank ends with its bits. Resets the
  // count of steps since the last synchronisation. Returns the winner's rank. `params`: any
  // float dtype, one dtype and device, the same sizes on every rank.
  int SynchronizeParameters(Communicator& comm, std::vector<Buffer> params);

  // The rank whose parameters SynchronizeParameters gives everyone, for the ranks' step counts
  // since the last synchronisation (index = rank): the most steps, the highest rank among
  // ties, rank 0 when every count is 0. InvalidArgumentError for an empty list or a negative count.
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
