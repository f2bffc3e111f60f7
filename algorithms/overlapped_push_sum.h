// Overlapped push-sum (OSGP, Assran et al. 2019): push-sum whose rounds run in the background
// while the caller keeps computing, folded into the parameters up to `tau` steps later.
//
// Starting a round packs s_j * x and s_j * w into one message per out-peer (as PushSum) and
// immediately keeps x <- s_0 x, w <- s_0 w locally; the caller may then change x freely (e.g.
// optimizer steps). Folding waits for the round's messages and adds them in:
// x <- x + sum_j x_j, w <- w + sum_j w_j. Summed over ranks and in-flight messages, x and w
// are conserved exactly as by synchronous push-sum. At most one round is in flight per object
// (one object per group of tensors).
//
// Step() is the training-loop call: once per local step, after the optimizer step. The round
// in flight, started at local step s, is folded at step s + tau (waiting for it then if it has
// not arrived); a new round starts whenever none is in flight. So with tau = 1 a round starts
// every step and is folded one step later; tau = 0 is synchronous push-sum. Folding is
// deterministic (it depends on step counts only), so every rank starts round r at the same
// local step and rounds select peers by their round number. Flush() folds explicitly.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "comm/communicator.h"
#include "comm/core/types.h"

namespace gossipcc {

namespace gossip_internal {
class PendingRound;
class MessagePool;
}

class OverlappedPushSum {
 public:
  static constexpr uint32_t kDefaultTag = 0x4f534700;  // "OSG"

  struct State {
    int64_t step = 0;               // local steps taken (Step calls)
    int64_t rounds = 0;             // gossip rounds started; round r uses the graph at step r
    double weight = 1.0;            // push-sum weight (after the local keep-share of a round in flight)
    bool in_flight = false;         // a round is started and not yet folded
    int64_t round_started_at = -1;  // local step at which the round in flight started
  };

  // tau >= 0: the staleness bound. mixing null: uniform.
  OverlappedPushSum(std::shared_ptr<const PeerGraph> graph, int tau = 1, MixingFn mixing = nullptr,
                    uint32_t tag = kDefaultTag);
  // Waits for a round still in flight (so no transfer outlives its storage); does not fold it.
  // Call Flush() first to keep its contribution.
  ~OverlappedPushSum();

  // One local step (see above); buffers as PushSum::Step, the same sizes every call.
  void Step(Communicator& comm, std::vector<Buffer> buffers);

  // Lower level: start a round now on x (InvalidArgumentError if one is in flight)...
  void StartRound(Communicator& comm, std::vector<Buffer> buffers);
  // ...and fold it in (waits for it). InvalidArgumentError if none is in flight. Errors as
  // PushSum::Step; after an error the round is dropped (its local share was already kept).
  void FinishRound(std::vector<Buffer> buffers);
  // Folds the round in flight, if any. Call before reading exact values, checkpointing or
  // destroying the object.
  void Flush(std::vector<Buffer> buffers);
  // True once the round in flight has arrived (folding it will not block).
  bool RoundArrived() const;

  void Debias(const Buffer& in, Buffer out) const;

  bool in_flight() const { return pending_ != nullptr; }
  double weight() const { return weight_; }
  int64_t step() const { return step_; }
  int64_t rounds() const { return rounds_; }
  int tau() const { return tau_; }
  State state() const;
  // Restores a checkpoint. A state with in_flight = true cannot be restored (its messages are
  // gone): Flush() before saving. InvalidArgumentError on bad values or if a round is in flight here.
  void Restore(const State& state);

 private:
  std::shared_ptr<const PeerGraph> graph_;
  int tau_;
  MixingFn mixing_;
  uint32_t tag_;
  double weight_ = 1.0;
  int64_t step_ = 0;
  std::shared_ptr<gossip_internal::MessagePool> pool_;
  int64_t rounds_ = 0;
  int64_t round_started_at_ = -1;
  std::unique_ptr<gossip_internal::PendingRound> pending_;
};

}  // namespace gossipcc
