// ProcessGroupGossipcc: gossipcc as a c10d backend (torch 1.13 ProcessGroup, torch 2.x
// Backend). It checks tensors, turns them into Buffer views and calls the torch-free
// Communicator; every call returns a c10d::Work whose future completes with its output tensors.
// It also runs gossipcc's own collectives (below; docs/pytorch.md). C++ users: the target
// //torch_backend:process_group, example torch_backend/examples/cpp_allreduce.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "torch_backend/algorithm_cache.h"
#include "torch_backend/allreduce_policy.h"
#include "torch_backend/callback_executor.h"
#include "torch_backend/collective_issue.h"
#include "torch_backend/op_lane.h"
#include "torch_backend/torch_version.h"

namespace gossipcc {

class PeerGraph;
class PushSum;
class HierarchicalPushSum;
class HierarchicalSymmetricGossip;
struct HostGroups;
class SymmetricGossip;
class BilateralExchange;
class AsyncBilateralExchange;
class FaultTolerantPushSum;
struct QuantizedAllreduceScratch;
namespace compression {
class PowerSGD;
}

namespace torch_backend {

struct Completion;  // gossipcc_work.h

struct ProcessGroupOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // How DDP's buckets are averaged (applied by the Python package's DDP hook).
  AllreducePolicy allreduce_policy;
  // Where the policy came from, for the message when ranks differ.
  std::string allreduce_policy_source;
  // Transport settings (timeout from above), with the environment applied over them and the
  // shared ones compared across ranks at construction (communicator_environment.h).
  CommunicatorOptions communicator;
};

// shutdown() joins threads that may need the Python GIL; the Python module installs a factory
// whose result, while alive, releases the GIL if this thread holds it (C++ users: none).
using BlockingRegionFactory = std::function<std::shared_ptr<void>()>;
void SetBlockingRegionFactory(BlockingRegionFactory factory);

class ProcessGroupGossipcc : public C10dBackendBase {
 public:
  // Rendezvous through `store` (c10d's, typically a PrefixStore made by init_process_group).
  ProcessGroupGossipcc(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                       ProcessGroupOptions options);
  ~ProcessGroupGossipcc() override;

  const std::string getBackendName() const override { return "gossipcc"; }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                       const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::AllgatherOptions& opts) override;
#if TORCH_VERSION_MAJOR >= 2
  // Each one collective over all pairs (coalesced_collectives.cc); torch 1.13 has neither.
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const ::c10d::ReduceScatterOptions& opts) override;
#endif
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const ::c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                        const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& output_split_sizes,
                                                 std::vector<int64_t>& input_split_sizes,
                                                 const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  // ---- gossipcc's own collectives --------------------------------------------------------
  // Contract (docs/pytorch.md, "gossipcc's own collectives"): arguments checked at the call
  // (InvalidArgumentError); then run in place on the algorithm lane (op_lane.h), in issue order
  // with the group's collectives; errors fail the Work and leave the tensors unchanged. Every
  // rank makes the same calls with the same steps; tensors untouched until the Work completes.
  // send/recv refuse tags in [kReservedTagBegin, kReservedTagEnd), the algorithms' own.
  static constexpr uint32_t kReservedTagBegin = 0x40000000;
  static constexpr uint32_t kReservedTagEnd = 0x60000000;
  static constexpr uint32_t kMonitoredBarrierTag = 0x4d420000;  // "MB": [+0, +0x10000)

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
    int64_t exchanges = 0;           // active: requests sent; passive: requests answered
    int last_peer = -1;              // peer of the last completed exchange or answer
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

  // Quantized all-reduce (compression/quantized_allreduce.h) of float32 CPU tensors; error feedback in
  // `residual` and `owned_residual` (both or neither), updated when the Work succeeds.
  c10::intrusive_ptr<::c10d::Work> quantized_allreduce(std::vector<at::Tensor> tensors, int64_t bits, bool average,
                                                       std::optional<at::Tensor> residual,
                                                       std::optional<at::Tensor> owned_residual,
                                                       int64_t block_size);

  // Fault-tolerant push-sum (algorithms/fault_tolerant_push_sum.h), collective: a communicator
  // of its own through this group's store (which must survive), timeout and settings.
  std::shared_ptr<FaultTolerantPushSum> fault_tolerant_push_sum(const std::string& graph);
  // One round of `state` on x (CPU float32/float64); a peer's failure is recovered inside it.
  c10::intrusive_ptr<::c10d::Work> fault_tolerant_push_sum_round(std::vector<at::Tensor> tensors,
                                                                 std::shared_ptr<FaultTolerantPushSum> state);

  // Runs the blocking call `fn` on the algorithm lane and waits (ordered with the group).
  void run_on_lane(const std::string& description, std::function<void()> fn, bool uses_collectives = true);

  // Calls made on it directly are not ordered with the lane's; prefer run_on_lane.
  Communicator& communicator() { return *communicator_; }
  const ProcessGroupOptions& options() const { return options_; }
  // Shuts the communicator down: pending and later calls fail with a clear error.
  void shutdown();

  // On: a collective issued outside the completion callbacks waits until every earlier
  // collective's callbacks have returned, so collectives issued inside callbacks (torch's
  // PowerSGD hooks) come in the same order on every rank (docs/pytorch.md). Same on every rank.
  void set_order_nested_collectives(bool on) { order_nested_ = on; }
  bool order_nested_collectives() const { return order_nested_; }

 private:
  std::shared_ptr<Work> IssueCollective(const char* what, const at::Tensor& tensor, torch_backend::IssueFn issue);
  // Where a Work completes: collectives in issue order, point-to-point as they finish.
  Completion Ordered() const;
  Completion Unordered() const;
  // The graph `spec` names on `nodes` nodes (default: this group's size).
  std::shared_ptr<const PeerGraph> Graph(const std::string& spec, const char* op, int nodes = -1);
  // This group's host group and group across hosts, made by the first call (a collective: on
  // lane_, in a call every rank makes).
  HostGroups& HostGroupsOnLane();
  // The asynchronous bilateral exchange's state, made by the first call.
  std::shared_ptr<AsyncBilateralExchange> AsyncBilateral();
  // A per-call timeout other than unset or the group's: InvalidArgumentError.
  void CheckCallTimeout(std::chrono::milliseconds timeout, const char* op, const char* options) const;

  ProcessGroupOptions options_;
  std::unique_ptr<Communicator> communicator_;
  uint64_t sequence_number_ = 0;
  // monitoredBarrier: calls so far (their tags: kMonitoredBarrierTag + 2 * (calls mod 2^15),
  // + 1 for the release), and the buffers of receives and sends still posted when one failed.
  uint32_t monitored_barrier_calls_ = 0;
  std::mutex monitored_barrier_mu_;
  std::vector<at::Tensor> monitored_barrier_retained_;

  // Peer graphs and the algorithms' objects, by spec; used only on the lanes after creation.
  AlgorithmCache algorithms_;
  mutable std::mutex async_stats_mu_;
  AsyncBilateralStats async_stats_;
  // The c10d store (wrapped) that fault-tolerant push-sum's communicators and the host groups
  // rendezvous through (key prefixes "gossipcc_ftps/<n>/", "gossipcc_hostgroups").
  std::shared_ptr<Store> fault_tolerant_store_;

  // Runs every Work's completion (its future's callbacks) off the communicator's threads.
  // Declared before the lanes: destroyed after them.
  std::shared_ptr<CallbackExecutor> executor_;
  std::atomic<bool> order_nested_{false};
  // Declared last: destroyed (stopped, joined) before anything their tasks use.
  std::unique_ptr<OpLane> lane_;        // algorithm calls and the collectives ordered with them
  std::unique_ptr<OpLane> async_lane_;  // asynchronous bilateral exchange
};

}  // namespace torch_backend
}  // namespace gossipcc
