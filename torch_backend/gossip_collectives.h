// GossipCollectives: gossipcc's own collectives on a process group (docs/pytorch.md, "gossipcc's
// own collectives"): the gossip rounds, the compressed all-reduces and fault-tolerant push-sum,
// thin adapters from tensors to algorithms/ and compression/, and the objects they keep between
// calls. ProcessGroupGossipcc owns one (its gossip()); C++ users reach them there.
//
// Contract: arguments are checked at the call (InvalidArgumentError); the operation then runs in
// place on the group's algorithm lane (op_lane.h), in issue order with the group's collectives,
// or on the asynchronous bilateral exchange's own lane; errors fail the Work and leave the
// tensors unchanged. Every rank makes the same calls with the same steps; the tensors are not
// touched by the caller until the Work completes.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/bilateral_exchange.h"
#include "comm/communicator.h"
#include "torch_backend/algorithm_cache.h"
#include "comm/sched/callback_executor.h"
#include "comm/sched/op_lane.h"
#include "torch_backend/torch_version.h"

namespace gossipcc {

struct HostGroups;
class AsyncBilateralExchange;
class FaultTolerantPushSum;
namespace compression {
class PowerSGD;
}

namespace torch_backend {

class GossipCollectives {
 public:
  // `lane` and `async_lane` belong to the process group and outlive every call made here;
  // `store` is the group's (wrapped) c10d store, for the communicators made later.
  GossipCollectives(Communicator& comm, std::shared_ptr<Store> store, OpLane& lane, OpLane& async_lane,
                    std::shared_ptr<CallbackExecutor> executor);

  // One push-sum round: `tensors` are x, `weight` w (1-element float64 CPU, updated in place);
  // keep: the share kept (nullopt: uniform). Future value: tensors + [weight].
  c10::intrusive_ptr<::c10d::Work> push_sum_round(std::vector<at::Tensor> tensors, at::Tensor weight, int64_t step,
                                                  const std::string& graph, std::optional<double> keep);
  // One D-PSGD round (Metropolis weights; `graph` undirected at `step`).
  c10::intrusive_ptr<::c10d::Work> symmetric_gossip_round(std::vector<at::Tensor> tensors, int64_t step,
                                                          const std::string& graph);
  // One pairwise averaging; matching "round_robin", "bipartite" or a graph of matchings.
  c10::intrusive_ptr<::c10d::Work> bilateral_exchange(std::vector<at::Tensor> tensors, int64_t step,
                                                      const std::string& matching);

  // AD-PSGD (algorithms/async_bilateral_exchange.h), CPU only, on a lane of its own. Active
  // (odd) ranks: one exchange with the next passive peer (the Work's sourceRank()).
  c10::intrusive_ptr<::c10d::Work> async_bilateral_exchange(std::vector<at::Tensor> tensors);
  // Passive (even) ranks: answer `max_requests` requests (-1: until every active rank finished).
  c10::intrusive_ptr<::c10d::Work> async_bilateral_serve(std::vector<at::Tensor> tensors, int max_requests);
  // Active ranks, once at the end.
  c10::intrusive_ptr<::c10d::Work> async_bilateral_finish(std::vector<at::Tensor> tensors);
  struct AsyncBilateralStats {
    int64_t exchanges = 0;             // active: requests sent; passive: requests answered
    int last_peer = -1;                // peer of the last completed exchange or answer
    bool all_active_finished = false;  // passive: every active peer has finished
  };
  AsyncBilateralStats async_bilateral_stats() const;
  // Restores an active rank's position in its peer schedule, before its first exchange.
  c10::intrusive_ptr<::c10d::Work> async_bilateral_restore(int64_t exchanges);

  // PowerSGD average, tensor i compressed as `shapes[i]` (empty: its own shape), its state in
  // `state` under `keys[i]` (empty: "tensor<i>"); `state` not used elsewhere meanwhile.
  c10::intrusive_ptr<::c10d::Work> powersgd_allreduce(std::vector<at::Tensor> tensors,
                                                      std::vector<std::vector<int64_t>> shapes,
                                                      std::shared_ptr<compression::PowerSGD> state,
                                                      std::vector<std::string> keys);
  // Quantized all-reduce (compression/quantized_allreduce.h) of float32 CPU tensors; error
  // feedback in `residual` and `owned_residual` (both or neither), updated when the Work succeeds.
  c10::intrusive_ptr<::c10d::Work> quantized_allreduce(std::vector<at::Tensor> tensors, int64_t bits, bool average,
                                                       std::optional<at::Tensor> residual,
                                                       std::optional<at::Tensor> owned_residual,
                                                       int64_t block_size);

  // Fault-tolerant push-sum (algorithms/fault_tolerant_push_sum.h), collective: a communicator
  // of its own through the group's store (which must survive), timeout and settings.
  std::shared_ptr<FaultTolerantPushSum> fault_tolerant_push_sum(const std::string& graph);
  // One round of `state` on x (CPU float32/float64); a peer's failure is recovered inside it.
  c10::intrusive_ptr<::c10d::Work> fault_tolerant_push_sum_round(std::vector<at::Tensor> tensors,
                                                                 std::shared_ptr<FaultTolerantPushSum> state);

  // Runs the blocking call `fn` on the algorithm lane and waits (ordered with the group).
  void run_on_lane(const std::string& description, std::function<void()> fn, bool uses_collectives = true);

  // Shuts down the communicators made here (the host groups); the group's own is the caller's.
  void Shutdown();

 private:
  enum class Lane { kAlgorithms, kAsync };
  // The one way an operation is issued: `task` on `lane`, and a Work that completes with
  // `outputs`, in issue order with the group's collectives on kAlgorithms, as it finishes on
  // kAsync. `title` is a literal "gossipcc:<op>" (c10d keeps the pointer); the lane's
  // description is "gossipcc <op> on rank r of n" + `details`. `source`, if set, is the Work's
  // sourceRank().
  c10::intrusive_ptr<::c10d::Work> Submit(Lane lane, const char* title, const std::string& details,
                                          std::function<void()> task, std::vector<at::Tensor> outputs,
                                          bool uses_collectives, std::shared_ptr<int> source = nullptr);
  // The graph `spec` names on `nodes` nodes (default: the group's size).
  std::shared_ptr<const PeerGraph> Graph(const std::string& spec, const char* op, int nodes = -1);
  // A bilateral exchange's matching over `nodes` (ranks or hosts): built-in, or a graph whose
  // every step is a matching (else InvalidArgumentError).
  struct MatchingSpec {
    BilateralExchange::Matching builtin;
    std::shared_ptr<const PeerGraph> graph;  // set: the matching is this graph
  };
  MatchingSpec Matching(const std::string& matching, const char* op, int nodes);
  // The group's host group and group across hosts, made by the first call (a collective: on
  // the algorithm lane, in a call every rank makes).
  HostGroups& HostGroupsOnLane();
  // The asynchronous bilateral exchange's state, made by the first call.
  std::shared_ptr<AsyncBilateralExchange> AsyncBilateral();

  Communicator& comm_;
  const int rank_;
  const int size_;
  // The store that fault-tolerant push-sum's communicators and the host groups rendezvous
  // through (key prefixes "gossipcc_ftps/<n>/", "gossipcc_hostgroups").
  std::shared_ptr<Store> store_;
  OpLane& lane_;
  OpLane& async_lane_;
  std::shared_ptr<CallbackExecutor> executor_;
  // Peer graphs and the algorithms' objects, by spec; used only on the lanes after creation.
  AlgorithmCache algorithms_;
  mutable std::mutex async_stats_mu_;
  AsyncBilateralStats async_stats_;
};

}  // namespace torch_backend
}  // namespace gossipcc
