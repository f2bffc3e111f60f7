// Push-sum that survives dead peers (opt-in): when a rank dies or stalls, the others agree on
// who is left, re-derive the graph over the survivors, restore the push-sum mass exactly as if
// the dead ranks had never taken part, and keep going. See docs/reliability.md ("Dropping a dead
// peer") for the design and its guarantees.
//
//   FaultTolerantPushSum ps(store, rank, world_size, {.graph = "exponential"});
//   for (...) { local_update(x); ps.Step({CpuBuffer(x, n)}); ps.Debias(x_buf, z_buf); }
//
// Failure detection: a Step whose transfers fail with a timeout or a transport error (any
// CommError except MismatchError / InvalidArgumentError) starts a recovery. The communicator
// is destroyed first, which closes its sockets, so the neighbours' own steps fail at once and
// they join the recovery too.
//
// Agreement (epoch e, keys "ftps/<e>/..." in the store): each rank in recovery writes
// join/<rank>, waits until every member of epoch e has joined or `join_window` has passed, then
// publishes the set it saw (view/<rank>) and reads the view of every rank in it. Equal views:
// that set is epoch e+1's membership. Unequal views (a rank joined at the very end of a window)
// or a view without this rank (it joined after the others closed the epoch: it was presumed
// dead): PeerError on the ranks concerned, nothing changed. Survivors get ranks 0..m-1 in
// ascending order of their original ranks and a new Communicator ("ftps/<e+1>/comm").
//
// Mass accounting: every rank records, per peer (original rank), in float64, the mass (x and
// w) it removed from itself and sent and the mass it received and added: since the last
// recovery (sent[p], recv[p]) and, as net[p] = sent - received, since the start. So always
// x_i = x_i(0) + local updates + sum_p (-net_i[p]). A step that fails changes and records
// nothing. In recovery each survivor i adds
//   sum over dead d of net_i[d]                       (take back what it gave the dead, give
//                                                      back what it got from them, ever)
// + sum over survivors j of (sent_j[i] - recv_i[j])   (mass in flight, or applied by i but not
//                                                      recorded as sent by j whose step failed)
// with sent_j[i] fetched from j over the new communicator (net_i[j] is settled likewise).
// Afterwards the survivors' sum of x equals the sum of their initial values plus their own
// local updates, and their sum of w is the number of survivors (up to float64 rounding; with
// float32 buffers, up to the rounding of storing x each step): the de-biased x / w converges to
// the survivors' average, as if the dead ranks had never been there. Individual weights can be
// small or negative right after a recovery (a rank gives back mass it received from the dead);
// push-sum is linear, so the ratio still converges, but x / w is unreliable for a few rounds.
// Steps and rounds: step() counts this rank's Step calls (training steps), so a loop may be
// driven by a local count or by step() alike: every survivor makes the same Step calls. The
// graph is indexed by a separate round counter (settling rounds count there, not as steps).
// When a failure strikes, survivors can be in different calls (a rank can have completed the
// round of step s while a neighbour failed in it). The recovery agrees on S, the largest step
// a survivor was in; a rank whose failed call was at step S still owes that round and does it
// once recovered (its partners do it in their next call); a rank at step s < S counts its
// failed call's round as done (the reconciliation settled its mass) and its calls for steps
// s+1..S-1 take no part in any exchange (the others did those rounds without it). So the calls
// stay paired: step() equals the number of calls on every survivor. Collectives (Average,
// MeanOverMembers, comm()) must be called at the same step() on every member: right after a
// recovering Step a rank that owed a round is one round ahead of those that return at once.
//
// Leaving (Leave(), or destroying the object): the rank marks itself as left in the store
// ("ftps/left/<rank>") before it closes its connections. A recovery that finds a member gone
// with that mark drops it as departed (departed(), not dead()): nothing exchanged with it is
// undone; the survivors keep the mass they hold, so their de-biased x / w converges to the
// weighted average of what they hold (if they were in consensus when it left, they stay
// there). The join window does not wait for a rank that left. A rank killed by a signal runs
// no destructor and leaves no mark: it is dead, and its exchanges are undone as above.
// Memory: three float64 vectors of (elements + 1) per distinct peer exchanged with.
//
// Not covered: the store itself must survive (a FileStore, or a TCPStore not hosted by a rank
// that may die); a failure while the survivors agree is reported (PeerError), a failure while
// they reconcile starts another recovery. CPU float32/float64 buffers, uniform mixing.
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
#include "comm/store.h"
#include "comm/types.h"

namespace gossipcc {

struct FaultTolerantPushSumOptions {
  // MakePeerGraph spec, instantiated over the current members (re-derived after each recovery).
  std::string graph = "exponential";
  // Options of every communicator this object creates; `timeout` bounds failure detection.
  CommunicatorOptions comm;
  // How long ranks in recovery wait for the other members to join. Zero: 2 * comm.timeout.
  std::chrono::milliseconds join_window{0};
  // Settling after a recovery: a recovery can leave single weights far from 1, even zero or
  // negative (a rank gives back what it received from the dead), so that x / w is useless for
  // training until push-sum has mixed again. With settle_rounds > 0, the Step that recovered
  // goes on with rounds without local updates (each counts as a step) until every member's
  // weight is within settle_tolerance of 1, at most settle_rounds of them. The weights tend to 1
  // on graphs that are regular at every step with uniform mixing (exponential on any n, ring,
  // complete, ...); on others they settle elsewhere and every settling takes settle_rounds.
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

  // One push-sum step on `buffers` (this rank's numerator x; CPU, float32 or float64, one
  // dtype, the same total count on every rank): normally one round. Returns true if no
  // recovery happened in it; false if a peer failed and this call recovered (x and weight()
  // then carry the recovery's corrections and the settling rounds' mixing, see settle_rounds;
  // last_recovery() says what happened). step() grows by one either way. Throws MismatchError
  // / InvalidArgumentError as PushSum does (nothing changed; also after Leave), PeerError if
  // the survivors could not agree or this rank was excluded.
  bool Step(std::vector<Buffer> buffers);

  // Leaves the group on purpose: marks this rank as left in the store, then closes its
  // connections; the others drop it as departed at their next exchange with it (not as dead,
  // see "Leaving" above). Idempotent. Step, Average and MeanOverMembers then throw
  // InvalidArgumentError. Throws the store's error if the mark cannot be written (the
  // connections are closed all the same: the others then see a death).
  void Leave();
  bool has_left() const { return left_; }

  // out <- in / weight().
  void Debias(const Buffer& in, Buffer out) const;

  // Collective over the current members: out <- (sum of every member's x) / (sum of their
  // weights), the value the de-biased x / w converges to, bitwise equal on every member
  // (summed in float64 by one all-reduce, whose result has the same bits on every rank). `x` as for Step; `out` a CPU
  // float32/float64 buffer of the same total count. x and weight() are left unchanged, so the
  // mass records stay exact. A peer failing during it raises its CommError and leaves the
  // communicator unusable: the next Step then recovers.
  void Average(const std::vector<Buffer>& x, Buffer out);
  // Collective over the current members: each buffer <- the members' mean of it, in place
  // (float64 sums; CPU float32/float64). For state that is
  // not push-sum mass (e.g. BatchNorm statistics); errors as Average.
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
  // `dropped`: the members this recovery dropped; those that left (agreed) are departed, the
  // others dead.
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
