// Push-sum gossip (SGP, Assran et al. 2019): a directed, column-stochastic gossip round that
// carries a scalar weight so that the de-biased value x / w converges to the average of all
// ranks' initial values on any sequence of strongly connected (time-varying) graphs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "algorithms/peer_graph.h"
#include "comm/communicator.h"
#include "comm/types.h"

namespace gossipcc {

// Column-stochastic mixing: given a rank, a step and its out-peers, returns the share it keeps
// followed by one share per out-peer (same order). Shares must be >= 0 and sum to 1.
using MixingFn = std::function<std::vector<double>(int rank, int64_t step, const std::vector<int>& out_peers)>;

class PushSum {
 public:
  static constexpr uint32_t kDefaultTag = 0x50534d00;  // "PSM"

  // `graph` must have world_size == comm.size() at each Step. `mixing` null: uniform
  // (keep 1/(p+1), send 1/(p+1) to each of p out-peers).
  explicit PushSum(std::shared_ptr<const PeerGraph> graph, MixingFn mixing = nullptr,
                   uint32_t tag = kDefaultTag);

  // One round at step(), in place on `buffers` (CPU, all float32 or all float64; together
  // they are this rank's numerator x): x <- s*x, w <- s*w, one fused message
  // (s_j*x, s_j*w) per out-peer, received (x_j, w_j) added in; then step() advances.
  // Every rank must call with the same step number and the same total element count:
  // a different count fails with MismatchError (from the comm layer), a different step with
  // MismatchError naming both steps (when the peer sets still match; on a time-varying
  // graph a step disagreement can instead leave a receive unmatched: TimeoutError).
  // On error the buffers, weight and step are left unchanged.
  void Step(Communicator& comm, std::vector<Buffer> buffers);

  // De-biased view: out <- in / weight() (same count and dtype, float32/float64, CPU;
  // out may equal in).
  void Debias(const Buffer& in, Buffer out) const;

  double weight() const { return weight_; }
  int64_t step() const { return step_; }
  // Checkpoint restore: sets the step counter and push-sum weight.
  void Restore(int64_t step, double weight);

  const PeerGraph& graph() const { return *graph_; }

 private:
  std::shared_ptr<const PeerGraph> graph_;
  MixingFn mixing_;
  uint32_t tag_;
  double weight_ = 1.0;
  int64_t step_ = 0;
};

}  // namespace gossipcc
