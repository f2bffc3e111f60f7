// Symmetric gossip (D-PSGD, Lian et al. 2017): x <- W_k x with a doubly stochastic W_k built
// from an undirected (symmetric) peer graph with Metropolis-Hastings weights
//   W_ij = 1 / (1 + max(d_i, d_j)) for each neighbour j,  W_ii = 1 - sum_j W_ij,
// where d is the degree at that step (1/3 on a ring of n >= 3; 1/(d+1) on any d-regular graph).
// No push-sum weight: the average over ranks is conserved and, on connected graphs, reached.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/peer_graph.h"
#include "comm/communicator.h"
#include "comm/core/types.h"

namespace gossipcc {

namespace gossip_internal {
class MessagePool;
}

class SymmetricGossip {
 public:
  static constexpr uint32_t kDefaultTag = 0x44505300;  // "DPS"

  // Throws InvalidArgumentError at Step if the graph is not symmetric at that step.
  explicit SymmetricGossip(std::shared_ptr<const PeerGraph> graph, uint32_t tag = kDefaultTag);

  // One round at step(), in place (float32/float64/float16/bfloat16 buffers, one dtype and device): one fused message
  // of x to each neighbour, x <- W_ii x + sum_j W_ij x_j; then step() advances. Same error
  // behaviour as PushSum::Step (MismatchError on differing sizes or steps, nothing modified).
  void Step(Communicator& comm, std::vector<Buffer> buffers);

  // Metropolis weights of `rank` at `step`: {self, one per neighbour in OutPeers order}.
  std::vector<double> Weights(int rank, int64_t step) const;

  int64_t step() const { return step_; }
  void Restore(int64_t step);
  const PeerGraph& graph() const { return *graph_; }

 private:
  std::shared_ptr<const PeerGraph> graph_;
  uint32_t tag_;
  int64_t step_ = 0;
  std::shared_ptr<gossip_internal::MessagePool> pool_;
};

}  // namespace gossipcc
