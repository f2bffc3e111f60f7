// All-reduce SGD with uneven step counts (torch-distlearn's AllReduceSGD).
//
// Ranks may run different numbers of steps (uneven data shards). Each step's gradients are
// summed over the ranks that contributed this step and divided by how many did. A rank that
// has run out of steps keeps joining the same collective with zeros (and says it is done)
// until every rank is done. Every call is ONE all-reduce of the gradients plus two trailing
// counters (contributors, ranks still training), in float64 for float64 gradients and float32
// otherwise (float16/bfloat16 are widened, reduced in float32 and rounded once).
//
//   UnevenAllReduceSGD sgd;
//   for (each local batch) { compute grads; sgd.SumAndNormalizeGradients(comm, grads); step; }
//   while (sgd.JoinUntilAllDone(comm, grads)) {}   // grads: same sizes, used as scratch
//   sgd.SynchronizeParameters(comm, params);       // every rank bitwise equal
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

  // Collective: params <- average over ranks, identical bits on every rank (all-reduce of
  // the average, then a broadcast of rank 0's result so no rounding difference survives).
  void SynchronizeParameters(Communicator& comm, std::vector<Buffer> params);

  int64_t steps_contributed() const { return steps_contributed_; }
  int64_t collectives() const { return collectives_; }
  void Restore(int64_t steps_contributed, int64_t collectives);

 private:
  StepResult Run(Communicator& comm, std::vector<Buffer>& grads, bool contribute);
  int64_t steps_contributed_ = 0;
  int64_t collectives_ = 0;
};

}  // namespace gossipcc
