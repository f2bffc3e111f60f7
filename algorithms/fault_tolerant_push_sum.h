// Push-sum that survives dead peers (opt-in; docs/reliability.md, "Dropping a dead peer", has
// the protocol and its proof sketch). A Step whose transfers fail with a timeout or a transport
// error starts a recovery: the survivors agree through the store on who is left, take part in a
// new communicator over a graph re-derived for them, and settle the push-sum mass from per-peer
// float64 records, so that x / w converges to the survivors' own average, as if the dead had never
// trained. A rank that Leave()s is dropped as departed: nothing exchanged with it is undone.
// The store must survive; CPU float32/float64 buffers, uniform mixing.
//
//   FaultTolerantPushSum ps(store, rank, world_size, {.graph = "exponential"});
//   for (...) { local_update(x); ps.Step({CpuBuffer(x, n)}); ps.Debias(x_buf, z_buf); }
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/peer_graph.h"
#include "algorithms/push_sum_ledger.h"
#include "comm/communicator.h"
#include "comm/core/store.h"
#include "comm/core/types.h"

namespace gossipcc {

struct FaultTolerantPushSumOptions {
  // MakePeerGraph spec, instantiated over the current members (re-derived after each recovery).
  std::string graph = "exponential";
  // Options of every communicator this object creates; `timeout` bounds failure detection.
  CommunicatorOptions comm;
  // How long ranks in recovery wait for the other members to join. Zero: 2 * comm.timeout.
  std::chrono::milliseconds join_window{0};
  // After a recovery, the recovering Step mixes without local updates until every weight is
  // within settle_tolerance of 1, at most settle_rounds rounds (a weight can come out 0).
  int settle_rounds = 0;
  double settle_tolerance = 0.05;
  uint32_t tag = 0x46545053;  // "FTPS"
};

// What the last recovery did.
struct RecoveryReport {
  int epoch = 0;                  // the epoch it created
  std::vector<int> dead;          // original ranks dropped as dead so far (cumulative)
  std::vector<int> departed;      // original ranks that left (Leave) so far (cumulative)
  std::vector<int> members;       // original ranks left
  int64_t step = 0;               // the step agreed on (the largest step a survivor was in)
  double weight_correction = 0;   // what this rank's weight changed by
};

class FaultTolerantPushSum {
 public:
  // Rendezvous of `world_size` ranks (original ranks 0..world_size-1) through `store`.
  FaultTolerantPushSum(std::shared_ptr<Store> store, int rank, int world_size,
                       FaultTolerantPushSumOptions options = {});
  // Leaves (see Leave) unless Leave was called; errors are swallowed.
  ~FaultTolerantPushSum();

  // One push-sum step on this rank's numerator x (one dtype, the same total count everywhere).
  // False if a peer failed and this call recovered instead (last_recovery()); step() grows by
  // one either way. MismatchError / InvalidArgumentError as PushSum (nothing changed),
  // PeerError if the survivors could not agree or this rank was excluded.
  bool Step(std::vector<Buffer> buffers);

  // Marks this rank as left in the store, then closes its connections (idempotent); later
  // Step/Average/MeanOverMembers throw InvalidArgumentError. The store's error if the mark
  // cannot be written (the others then see a death).
  void Leave();
  bool has_left() const { return left_; }

  // out <- in / weight().
  void Debias(const Buffer& in, Buffer out) const;

  // Collective over the members: out <- sum of x / sum of weights (the consensus), bitwise equal
  // on every member; x and weight() unchanged. A peer failing raises; the next Step recovers.
  void Average(const std::vector<Buffer>& x, Buffer out);
  // Collective: each buffer <- the members' mean (state that is not mass, e.g. BatchNorm's).
  void MeanOverMembers(const std::vector<Buffer>& buffers);

  double weight() const { return weight_; }
  int64_t step() const { return step_; }      // Step calls made (training steps)
  int64_t round() const { return round_; }    // exchange rounds (graph index), settling included
  int epoch() const { return epoch_; }
  int rank() const { return rank_; }  // original rank
  const std::vector<int>& members() const { return members_; }  // original ranks, ascending
  const std::vector<int>& dead() const { return dead_; }        // every rank dropped as dead so far
  const std::vector<int>& departed() const { return departed_; }  // every rank that left so far
  const RecoveryReport& last_recovery() const { return last_recovery_; }
  // The current group's communicator (ranks 0..members().size()-1).
  Communicator& comm() { return *comm_; }

 private:
  void Connect();
  bool Round(const std::vector<Buffer>& buffers, size_t count);  // one round, or a recovery: false
  void Recover(const std::vector<Buffer>& buffers, size_t count);
  void Reconcile(const std::vector<Buffer>& buffers, size_t count, const std::vector<int>& dropped);
  int GroupRank(int original) const;
  void Settle(const std::vector<Buffer>& buffers, size_t count);
  void CheckNotLeft(const char* what) const;

  std::shared_ptr<Store> store_;
  const int rank_;
  const int world_size_;
  const FaultTolerantPushSumOptions options_;
  std::chrono::milliseconds window_;
  std::vector<int> members_;
  std::vector<int> dead_;
  std::vector<int> departed_;
  int epoch_ = 0;
  int64_t step_ = 0;          // Step calls completed
  int64_t round_ = 0;         // exchange rounds (agreed across members)
  int64_t resume_step_ = 0;   // after a recovery: steps below it take no part in any exchange
  bool left_ = false;
  double weight_ = 1.0;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<PeerGraph> graph_;
  MassLedger ledger_;  // mass sent and received per peer (push_sum_ledger.h)
  RecoveryReport last_recovery_;
};

}  // namespace gossipcc
