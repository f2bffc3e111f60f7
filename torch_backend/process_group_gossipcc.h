// ProcessGroupGossipcc: gossipcc as a c10d backend (torch 1.13 ProcessGroup, torch 2.x Backend).
//
// A thin adapter: it checks tensors, turns them into gossipcc::Buffer views and calls the
// torch-free Communicator (comm/communicator.h), which moves CPU tensors over Gloo and CUDA
// tensors over NCCL, chosen per tensor device. Every call returns a c10d::Work whose
// future completes with the call's output tensors. Unsupported calls raise an error that
// names the operation.
//
// C++ users: ProcessGroupGossipcc::Create(c10d store, rank, size, options).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "torch_backend/allreduce_policy.h"
#include "torch_backend/torch_version.h"

namespace gossipcc {
namespace torch_backend {

struct ProcessGroupOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // How DDP's gradient buckets are all-reduced (see allreduce_policy.h). Plain allreduce
  // calls are always exact; the policy is applied by the gossipcc Python package's DDP hook.
  AllreducePolicy allreduce_policy;
  // Transport settings; timeout is taken from `timeout` above.
  CommunicatorOptions communicator;
};

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

  // The torch-free communicator underneath (for gossipcc's own collectives).
  Communicator& communicator() { return *communicator_; }
  const ProcessGroupOptions& options() const { return options_; }
  // Shuts the communicator down: pending and later calls fail with a clear error.
  void shutdown();

 private:
  ProcessGroupOptions options_;
  std::unique_ptr<Communicator> communicator_;
  uint64_t sequence_number_ = 0;
};

}  // namespace torch_backend
}  // namespace gossipcc
