// Push-sum gossip (SGP, Assran et al. 2019): a directed, column-stochastic gossip round that
// carries a scalar weight so that the de-biased value x / w converges to the average of all
// ranks' initial values on any sequence of strongly connected (time-varying) graphs.
//
// Per round at step k, with p out-peers and shares s_0 (kept) + s_1..s_p (sent) summing to 1
// (uniform: all 1/(p+1)):  x <- s_0 x + sum_{j in in(k)} (s_j x_j),  w likewise.
// Each out-peer gets ONE message: [8-byte step][s_j as double][x, all buffers][w as double],
// standing for (s_j x, s_j w); Step sends x from the caller's buffers without a copy.
// sum_i x_i and sum_i w_i (= n) are conserved by every round.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/peer_graph.h"
#include "comm/communicator.h"
#include "comm/core/types.h"

namespace gossipcc {

// Column-stochastic mixing: given a rank, a step and its out-peers, returns the share it keeps
// followed by one share per out-peer (same order). Shares must be finite, >= 0 and sum to 1
// (within 1e-12); the rounds validate them and raise InvalidArgumentError naming rank and step.
using MixingFn = std::function<std::vector<double>(int rank, int64_t step, const std::vector<int>& out_peers)>;

// Mixing that keeps `keep` (0 < keep <= 1) and splits the rest equally among the out-peers
// (keep = 1 when there are none).
MixingFn KeepShareMixing(double keep);

// What one rank does in one push-sum round.
struct PushSumPlan {
  std::vector<int> out_peers;
  std::vector<double> send_shares;  // one per out-peer
  std::vector<int> in_peers;
  double keep = 1.0;
};
// Validated plan of `rank` at `step` (mixing null: uniform).
PushSumPlan MakePushSumPlan(const PeerGraph& graph, const MixingFn& mixing, int rank, int64_t step,
                            const std::string& algorithm = "push_sum");

namespace gossip_internal {
class MessagePool;
class PendingRound;

// The first half of every push-sum round (PushSum, OverlappedPushSum): checks that `graph`
// is for comm.size() ranks and the buffers are acceptable, plans comm.rank()'s round at
// `step` (into *plan) and posts one message of s_j * x and s_j * weight per out-peer.
// Errors name `algorithm`. The caller keeps plan->keep locally and folds the round in.
std::unique_ptr<PendingRound> StartPushSumRound(const std::string& algorithm, Communicator& comm,
                                                const PeerGraph& graph, const MixingFn& mixing, int64_t step,
                                                uint32_t tag, std::shared_ptr<MessagePool> pool, double weight,
                                                const std::vector<Buffer>& buffers, bool send_in_place,
                                                PushSumPlan* plan);
}  // namespace gossip_internal

class PushSum {
 public:
  static constexpr uint32_t kDefaultTag = 0x50534d00;  // "PSM"

  // `graph` must have world_size == comm.size() at each Step. `mixing` null: uniform.
  explicit PushSum(std::shared_ptr<const PeerGraph> graph, MixingFn mixing = nullptr,
                   uint32_t tag = kDefaultTag);

  // One round at step(), in place on `buffers` (together they are this rank's numerator x;
  // float32/float64/float16/bfloat16, one dtype, one device; CUDA buffers are staged through
  // host memory). Then step() advances.
  // Every rank must call with the same step number and the same total element count: a
  // different count fails with MismatchError (from the comm layer's receive check, re-raised
  // naming the algorithm, step and sizes), a different step with MismatchError naming both
  // steps when the message arrives (on a time-varying graph a step disagreement can instead
  // leave a receive unmatched: TimeoutError after the communicator's timeout).
  // On error the buffers, weight and step are left unchanged.
  void Step(Communicator& comm, std::vector<Buffer> buffers);

  // De-biased view: out <- in / weight() (same count and dtype; out may equal in).
  void Debias(const Buffer& in, Buffer out) const;

  double weight() const { return weight_; }
  int64_t step() const { return step_; }
  // Checkpoint restore: sets the step counter and push-sum weight (finite, > 0).
  void Restore(int64_t step, double weight);

  const PeerGraph& graph() const { return *graph_; }

 private:
  std::shared_ptr<const PeerGraph> graph_;
  MixingFn mixing_;
  uint32_t tag_;
  double weight_ = 1.0;
  int64_t step_ = 0;
  std::shared_ptr<gossip_internal::MessagePool> pool_;
};

// out <- in / weight for any accepted dtype/device (used by PushSum and OverlappedPushSum).
void DebiasBuffer(const std::string& algorithm, double weight, const Buffer& in, Buffer out);

}  // namespace gossipcc
