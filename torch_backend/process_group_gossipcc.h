// ProcessGroupGossipcc: gossipcc as a c10d backend (torch 1.13 ProcessGroup, torch 2.x Backend).
//
// A thin adapter: it checks tensors, turns them into gossipcc::Buffer views and calls the
// torch-free Communicator (comm/communicator.h), which moves CPU tensors over Gloo and CUDA
// tensors over NCCL, chosen per tensor device. Every call returns a c10d::Work whose
// future completes with the call's output tensors. Unsupported calls raise an error that
// names the operation.
//
// Besides c10d's standard calls it offers gossipcc's own collectives (push-sum, symmetric
// gossip, bilateral exchange, asynchronous bilateral exchange, PowerSGD); see "gossipcc's own
// collectives" below.
//
// C++ users: construct one from a c10d store, rank, size and ProcessGroupOptions (the Bazel
// target //torch_backend:process_group; example: torch_backend/examples/cpp_allreduce.cc).
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
#include "torch_backend/callback_executor.h"
#include "torch_backend/op_lane.h"
#include "torch_backend/torch_version.h"

namespace gossipcc {

class PeerGraph;
class PushSum;
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
  // How DDP's gradient buckets are all-reduced (see allreduce_policy.h). Plain allreduce
  // calls are always exact; the policy is applied by the gossipcc Python package's DDP hook.
  AllreducePolicy allreduce_policy;
  // Where allreduce_policy came from, as the check at construction names it when ranks differ:
  // "GOSSIPCC_ALLREDUCE" or "gossipcc.configure(allreduce=...)" (the Python package's); empty:
  // "ProcessGroupOptions::allreduce_policy".
  std::string allreduce_policy_source;
  // Transport settings; timeout is taken from `timeout` above. Construction applies the
  // environment over them (communicator_environment.h), then checks, through the store, that
  // every rank has the same values of the settings that must agree (the policy, lanes, ...): a
  // rank that differs, or whose settings are invalid, fails construction on every rank, naming
  // the variable and each rank's value.
  CommunicatorOptions communicator;
};

// Blocking regions: shutdown() joins threads of ours that may need the Python GIL (to run a
// future's Python callback, or to release a tensor whose Python object died while C++ held
// it). When the process group is destroyed from Python with the GIL held (e.g. DDP's Reducer
// dropping the last reference), joining them would deadlock. The Python module installs a
// factory whose result, while alive, releases the GIL if this thread holds it; without one
// (C++ users) nothing is done.
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
  // Common contract (the algorithms themselves are in algorithms/ and compression/):
  //  - Arguments are checked on the calling thread; bad ones raise InvalidArgumentError at
  //    once (a ValueError in Python): empty lists, mixed dtypes or devices, non-contiguous
  //    tensors, dtypes other than float32/float64/float16/bfloat16, step < 0, unknown graphs.
  //  - The operation then runs asynchronously on the group's algorithm lane (op_lane.h): one
  //    at a time, in issue order, ordered with the group's other collectives. The returned
  //    Work's future completes with the output tensors (the inputs, updated in place); errors
  //    of the algorithm (MismatchError, TimeoutError, PeerError, AbortedError) fail the Work
  //    and are raised by wait(). On an error the tensors are left unchanged.
  //  - Every rank must make the same sequence of these calls (per lane) with the same step
  //    numbers and total element counts; the calls are stateless: the step (and push-sum
  //    weight) comes from the caller each time, and peer graphs and algorithm objects are
  //    cached per spec, so a call costs one gossip round and no setup.
  //  - The tensors must not be read or written until the Work completes.
  //  - CUDA tensors: the caller's current stream is synchronised at the call, and the
  //    algorithms stage them through host memory.
  // Point-to-point tags: gossipcc reserves [kReservedTagBegin, kReservedTagEnd) for its
  // algorithms; send/recv with a tag in that range is refused.
  static constexpr uint32_t kReservedTagBegin = 0x40000000;
  static constexpr uint32_t kReservedTagEnd = 0x60000000;
  static constexpr uint32_t kMonitoredBarrierTag = 0x4d420000;  // "MB": [+0, +0x10000)

  // One push-sum round (SGP) at `step`, in place: together `tensors` are this rank's
  // numerator x; `weight` is its push-sum weight w (a 1-element float64 CPU tensor, > 0),
  // read when the round runs and updated in place. `graph` is a MakePeerGraph spec
  // (algorithms/peer_graph.h); keep: the share a rank keeps (KeepShareMixing), nullopt:
  // uniform 1/(out-degree + 1). Future value: tensors + [weight].
  c10::intrusive_ptr<::c10d::Work> push_sum_round(std::vector<at::Tensor> tensors, at::Tensor weight, int64_t step,
                                                  const std::string& graph, std::optional<double> keep);
  // One symmetric gossip round (D-PSGD) at `step` with Metropolis weights on `graph`, which
  // must be undirected at that step. Future value: tensors.
  c10::intrusive_ptr<::c10d::Work> symmetric_gossip_round(std::vector<at::Tensor> tensors, int64_t step,
                                                          const std::string& graph);
  // One synchronous bilateral exchange (pairwise averaging) at `step`. matching:
  // "round_robin", "bipartite" (AD-PSGD's active/passive matching; even world size) or a
  // peer graph spec whose every step is a matching (e.g. "hypercube"). Future value: tensors.
  c10::intrusive_ptr<::c10d::Work> bilateral_exchange(std::vector<at::Tensor> tensors, int64_t step,
                                                      const std::string& matching);

  // Asynchronous bilateral exchange (AD-PSGD, algorithms/async_bilateral_exchange.h). CPU
  // tensors only. These run on a lane of their own (a passive rank's serve may wait for a
  // long time without holding up the group's other collectives), in issue order.
  // Active (odd) ranks: one exchange with the next passive peer; x <- (x + x_peer) / 2. The
  // Work's sourceRank() (Python: work._source_rank() / source_rank()) is that peer.
  c10::intrusive_ptr<::c10d::Work> async_bilateral_exchange(std::vector<at::Tensor> tensors);
  // Passive (even) ranks: answers requests until `max_requests` were answered (-1: until
  // every active rank has finished). Each answer averages `tensors` with the requester's.
  c10::intrusive_ptr<::c10d::Work> async_bilateral_serve(std::vector<at::Tensor> tensors, int max_requests);
  // Active ranks, once at the end: tells every passive peer that no more requests come.
  c10::intrusive_ptr<::c10d::Work> async_bilateral_finish(std::vector<at::Tensor> tensors);
  struct AsyncBilateralStats {
    int64_t exchanges = 0;           // active: requests sent; passive: requests answered
    int last_peer = -1;              // peer of the last completed exchange or answer
    bool all_active_finished = false;  // passive: every active peer has finished
  };
  AsyncBilateralStats async_bilateral_stats() const;
  // Sets the asynchronous exchange's request counter (a checkpoint's position in an active
  // rank's peer schedule: its next request goes to PassivePeers()[exchanges % their number]).
  // Runs on the asynchronous lane in issue order; call it before a restored run's first exchange.
  c10::intrusive_ptr<::c10d::Work> async_bilateral_restore(int64_t exchanges);

  // PowerSGD all-reduce (compression/power_sgd.h): averages `tensors` in place across the
  // group, each compressed as the matrix `shapes[i]` (`shapes` empty: every tensor's own shape; the
  // product must equal its numel), its state in `state` under `keys[i]` (empty: "tensor<i>").
  // `state` must not be used elsewhere until the Work completes. Future value: tensors.
  c10::intrusive_ptr<::c10d::Work> powersgd_allreduce(std::vector<at::Tensor> tensors,
                                                      std::vector<std::vector<int64_t>> shapes,
                                                      std::shared_ptr<compression::PowerSGD> state,
                                                      std::vector<std::string> keys);

  // Quantized all-reduce (comm/quantized_allreduce.h): `tensors` (together one float32 vector, CPU)
  // <- the sum (average: the mean) of every rank's, sent as `bits` (8 or 4) per element plus a
  // float32 scale per `block_size` elements; lossy, within the bound that header states, and
  // bitwise identical on every rank. Error feedback: `residual` and `owned_residual`, float32 CPU
  // tensors of the tensors' total element count (zeros at first), updated in place when the Work
  // succeeds (both or neither). Bad bits, block size, dtype or device, residuals of the wrong size,
  // and ranks that disagree: the Work fails on every rank (InvalidArgumentError or MismatchError),
  // nothing modified. Future value: tensors.
  c10::intrusive_ptr<::c10d::Work> quantized_allreduce(std::vector<at::Tensor> tensors, int64_t bits, bool average,
                                                       std::optional<at::Tensor> residual,
                                                       std::optional<at::Tensor> owned_residual,
                                                       int64_t block_size);

  // Fault-tolerant push-sum (SGP that survives dead peers: algorithms/fault_tolerant_push_sum.h,
  // docs/reliability.md "Dropping a dead peer"). Collective: every rank creates one, in the same
  // order, with the same `graph` (a spec that fits every size down to 1, since it is re-derived
  // over the survivors). The state owns a communicator of its own (it replaces it in each
  // recovery) over this group's ranks, rendezvoused through this group's c10d store under a key
  // prefix of its own, with this group's timeout and transport settings: the store must survive
  // any rank that may die (a FileStore, or a TCPStore whose host is not among them; under env://
  // rank 0 hosts it). Ranks are this group's ranks; members()/dead() name them.
  std::shared_ptr<FaultTolerantPushSum> fault_tolerant_push_sum(const std::string& graph);
  // One round of `state` on `tensors` (together this rank's numerator x, in place; CPU
  // float32/float64, one dtype), on the algorithm lane. If a peer failed, the call recovers
  // instead (the survivors agree on who is left and settle the mass; state->epoch() grows and
  // state->last_recovery() says what happened) and the Work succeeds. Errors that fail the Work:
  // the survivors could not agree or this rank was excluded (PeerError), mismatched calls
  // (MismatchError). Bad tensors raise InvalidArgumentError at the call. Future value: tensors.
  c10::intrusive_ptr<::c10d::Work> fault_tolerant_push_sum_round(std::vector<at::Tensor> tensors,
                                                                 std::shared_ptr<FaultTolerantPushSum> state);

  // Runs `fn` (a blocking algorithm call on communicator()) on the algorithm lane and waits
  // for it: ordered with every other collective of the group. For the blocking bindings
  // (elastic averaging, uneven all-reduce SGD, PowerSGD.allreduce). `uses_collectives`: `fn`
  // issues communicator collectives.
  void run_on_lane(const std::string& description, std::function<void()> fn, bool uses_collectives = true);

  // The torch-free communicator underneath (for gossipcc's own collectives). Calls made on it
  // directly are not ordered with the lane's; prefer run_on_lane.
  Communicator& communicator() { return *communicator_; }
  const ProcessGroupOptions& options() const { return options_; }
  // Shuts the communicator down: pending and later calls fail with a clear error.
  void shutdown();

  // Orders collectives issued inside completion callbacks (nested: PyTorch's powerSGD_hook
  // issues an all_reduce in a callback and waits for it there) before any collective issued
  // later by another thread. Without it, with several DDP buckets, the autograd thread's next
  // bucket and an earlier bucket's callback issue collectives concurrently, in an order that
  // can differ between ranks (a MismatchError; gloo deadlocks there). With it, a collective
  // issued by a thread outside the callbacks waits until the callbacks of every earlier
  // collective have returned: the same order on every rank, at the cost of that collective
  // not starting before the earlier ones' callbacks end. Every rank must set the same value
  // before such hooks run; gossipcc sets it when torch's PowerSGD hooks are registered on a
  // DDP model of the group (gossipcc/ddp.py).
  void set_order_nested_collectives(bool on) { order_nested_ = on; }
  bool order_nested_collectives() const { return order_nested_; }

 private:
  std::shared_ptr<Work> IssueCollective(const char* what, const at::Tensor& tensor,
                                        std::function<std::shared_ptr<Work>()> issue);
  // Where a returned Work completes (gossipcc_work.h): collectives and algorithm calls in issue
  // order, point-to-point operations as they finish.
  Completion Ordered() const;
  Completion Unordered() const;
  std::shared_ptr<const PeerGraph> Graph(const std::string& spec, const char* op);
  // A per-call timeout (the options structs' `timeout`) must be unset or the group's: every
  // collective's deadline is the group's timeout after its call (comm/issue_time.h), so another
  // value is refused with InvalidArgumentError naming the call, the value and the group's.
  void CheckCallTimeout(std::chrono::milliseconds timeout, const char* op, const char* options) const;

  ProcessGroupOptions options_;
  std::unique_ptr<Communicator> communicator_;
  uint64_t sequence_number_ = 0;
  // monitoredBarrier: calls so far (their tags: kMonitoredBarrierTag + 2 * (calls mod 2^15),
  // + 1 for the release), and the buffers of receives and sends still posted when one failed.
  uint32_t monitored_barrier_calls_ = 0;
  std::mutex monitored_barrier_mu_;
  std::vector<at::Tensor> monitored_barrier_retained_;

  // Cached per spec (peer graphs, algorithm objects); used only on the lanes after creation.
  std::mutex cache_mu_;
  std::map<std::string, std::shared_ptr<const PeerGraph>> graphs_;
  std::map<std::string, std::shared_ptr<PushSum>> push_sums_;
  std::map<std::string, std::shared_ptr<SymmetricGossip>> symmetric_gossips_;
  std::map<std::pair<std::string, int64_t>, bool> symmetric_at_;  // (spec, step mod period)
  std::map<std::string, std::shared_ptr<BilateralExchange>> bilateral_exchanges_;
  std::shared_ptr<AsyncBilateralExchange> async_bilateral_;
  mutable std::mutex async_stats_mu_;
  AsyncBilateralStats async_stats_;
  // Fault-tolerant push-sum: the c10d store (wrapped) its communicators rendezvous through, and
  // how many states this group has created (each gets the key prefix "gossipcc_ftps/<n>/").
  std::shared_ptr<Store> fault_tolerant_store_;
  int fault_tolerant_states_ = 0;
  // The quantized all-reduce's working memory, kept between calls (they run one at a time, on
  // lane_); created by the first call.
  std::shared_ptr<QuantizedAllreduceScratch> quantized_scratch_;

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
