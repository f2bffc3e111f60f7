// All-reduce of a CPU buffer around a ring (docs/comm.md, "The ring"), in place: the same bits on
// every rank. Same count, dtype (not float16/bfloat16) and op on every rank; a disagreement raises
// the same MismatchError on every rank before anything reaches `data`.
#pragma once

#include <vector>

#include "comm/core/types.h"
#include "comm/gloo/call.h"

namespace gossipcc {

void RingAllreduce(const GlooCall& call, Buffer data, ReduceOp op);

// A ring over some mesh ranks: this rank is member `index` of `size`, between `left` and `right`.
struct RingMembers {
  int index;
  int size;
  int left;
  int right;
  // This rank's place on the ring `ranks` (mesh ranks in ring order; `rank` among them).
  static RingMembers Of(const std::vector<int>& ranks, int rank);
};

// Which of a ring all-reduce's messages run: all of them, the reduce-scatter's (member i ends
// with chunk i + 1 of RingPlan(size, i, count) reduced over the ring, averaged for kAvg), or
// the all-gather's (every member starts with its own chunk complete).
enum class RingPhases { kBoth, kReduceScatter, kAllgather };

// RingAllreduce's algorithm on `ring` only, for the phases asked. The members must make the
// same call; with call.check set, only kBoth overlaps it (other phases need it run already).
void RingAllreduceAmong(const GlooCall& call, const RingMembers& ring, Buffer data, ReduceOp op, RingPhases phases);

}  // namespace gossipcc
