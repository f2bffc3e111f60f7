// ProcessGroupGossipcc: gossipcc as a c10d backend (torch 1.13 ProcessGroup, torch 2.x
// Backend). It checks tensors, turns them into Buffer views and calls the torch-free
// Communicator; every call returns a c10d::Work whose future completes with its output tensors.
// It also runs gossipcc's own collectives (its gossip(); docs/pytorch.md). C++ users: the target
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
#include "torch_backend/allreduce_policy.h"
#include "comm/sched/callback_executor.h"
#include "comm/sched/collective_issue.h"
#include "torch_backend/gossip_collectives.h"
#include "comm/sched/op_lane.h"
#include "torch_backend/torch_version.h"

namespace gossipcc {

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

  // send/recv refuse tags in [kReservedTagBegin, kReservedTagEnd), the algorithms' own.
  static constexpr uint32_t kReservedTagBegin = 0x40000000;
  static constexpr uint32_t kReservedTagEnd = 0x60000000;
  static constexpr uint32_t kMonitoredBarrierTag = 0x4d420000;  // "MB": [+0, +0x10000)

  // gossipcc's own collectives (gossip_collectives.h), ordered with this group's.
  GossipCollectives& gossip() { return *gossip_; }
  // Runs the blocking call `fn` on the algorithm lane and waits (ordered with the group).
  void run_on_lane(const std::string& description, std::function<void()> fn, bool uses_collectives = true) {
    gossip_->run_on_lane(description, std::move(fn), uses_collectives);
  }

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
  std::shared_ptr<Work> IssueCollective(const char* what, const at::Tensor& tensor, gossipcc::IssueFn issue);
  // Where a Work completes: collectives in issue order, point-to-point as they finish.
  Completion Ordered() const;
  Completion Unordered() const;
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

  // Runs every Work's completion (its future's callbacks) off the communicator's threads.
  // Declared before the lanes: destroyed after them.
  std::shared_ptr<CallbackExecutor> executor_;
  std::atomic<bool> order_nested_{false};
  // Its objects are used by the lanes' tasks: declared before the lanes, destroyed after them.
  std::unique_ptr<GossipCollectives> gossip_;
  // Declared last: destroyed (stopped, joined) before anything their tasks use.
  std::unique_ptr<OpLane> lane_;        // algorithm calls and the collectives ordered with them
  std::unique_ptr<OpLane> async_lane_;  // asynchronous bilateral exchange
};

}  // namespace torch_backend
}  // namespace gossipcc
