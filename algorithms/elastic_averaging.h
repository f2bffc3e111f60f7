// Elastic averaging (synchronous EASGD; torch-distlearn's AllReduceEA): every `tau` local steps
// d = alpha * (x - c); x <- x - d; c <- c + allreduce_sum(d). sum_i x_i + c is conserved and every
// rank's center (float64) stays identical.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "comm/core/types.h"

namespace gossipcc {

class ElasticAveraging {
 public:
  // tau >= 1 (average every tau steps); 0 < alpha <= 1 (the elastic moving rate).
  ElasticAveraging(int tau, double alpha);

  // Collective, once before training: every rank's parameters <- rank 0's (broadcast), and the
  // center <- those parameters. Resets step() to 0.
  void Initialize(Communicator& comm, std::vector<Buffer> params);

  // Once per local step, after the optimizer's: at multiples of tau averages (collective) and
  // returns true. One float dtype and device. Ranks at different steps: MismatchError, nothing modified.
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
