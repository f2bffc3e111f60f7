// Elastic averaging (synchronous EASGD; torch-distlearn's AllReduceEA).
//
// Each rank keeps its parameters x and a copy of the center c. Every `tau` local steps:
//   d = alpha * (x - c);   x <- x - d;   c <- c + allreduce_sum(d)
// (one all-reduce of the parameters' size, in their dtype). sum_i x_i + c is conserved by each
// averaging (up to one rounding of x - d per element), and every rank's copy of c stays
// identical (they add the same all-reduced sum). The center is held in float64.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "comm/types.h"

namespace gossipcc {

class ElasticAveraging {
 public:
  // tau >= 1 (average every tau steps); 0 < alpha <= 1 (the elastic moving rate).
  ElasticAveraging(int tau, double alpha);

  // Collective, once before training: every rank's parameters <- rank 0's (broadcast), and the
  // center <- those parameters. Resets step() to 0.
  void Initialize(Communicator& comm, std::vector<Buffer> params);

  // Once per local step, after the optimizer step: advances step(), and when it reaches a
  // multiple of tau, averages (a collective every rank must join at the same step). Returns
  // true if it averaged. Buffers: float32/float64/float16/bfloat16, one dtype and device (CUDA
  // staged through host memory), total size equal to the center's.
  // Ranks averaging at different step numbers: MismatchError naming the steps, before anything
  // is modified (a step number is all-reduced alongside d).
  bool Step(Communicator& comm, std::vector<Buffer> params);

  // One averaging now (collective), independent of tau.
  void Average(Communicator& comm, std::vector<Buffer> params);

  int tau() const { return tau_; }
  double alpha() const { return alpha_; }
  int64_t step() const { return step_; }
  // The center, flattened over the parameter buffers in order.
  const std::vector<double>& center() const { return center_; }
  // Checkpoint restore (the center's size must match the parameters at the next Step).
  void Restore(int64_t step, std::vector<double> center);

 private:
  int tau_;
  double alpha_;
  int64_t step_ = 0;
  bool initialized_ = false;
  std::vector<double> center_;
};

}  // namespace gossipcc
