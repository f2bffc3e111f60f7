// The Communicator facade. Every call reads: check the arguments (here, synchronously:
// InvalidArgumentError), describe it (collective_plan.h: the OpSpec every rank must agree on,
// the memory it touches, its data path: eager, Gloo or NCCL), schedule it (Lanes: a collective
// starts only after every earlier one on overlapping memory), run it (Run: the deadline, the
// signature check, then the plan's data path, and the error mapping). The parts, one job each:
// meshes.h (connections, the options every rank must share, the shutdown order), lanes.h
// (which collective runs when, on which thread), peer_health.h (heartbeats and the peer check
// appended to errors), failure_state.h (usable, poisoned or shut down); the data paths below
// them (gloo/collectives.h, eager_collectives.h, p2p/exchange.h, nccl/nccl_transport.h).
#include "comm/communicator.h"

#include <gloo/context.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/argument_checks.h"
#include "comm/collective_plan.h"
#include "comm/core/errors.h"
#include "comm/core/op_spec.h"
#include "comm/core/reduce.h"
#include "comm/failure_state.h"
#include "comm/gloo/consistency_check.h"
#include "comm/gloo/gloo_error.h"
#include "comm/lanes.h"
#include "comm/meshes.h"
#include "comm/nccl/nccl_transport.h"
#include "comm/peer_health.h"
#include "comm/staged_work.h"

namespace gossipcc {
namespace {
using Clock = std::chrono::steady_clock;

// When an operation was issued: its deadline counts from `at`, the caller's issue time
// (CallOptions::issued) where it set one, else the Communicator call (`called`).
struct Issue {
  Clock::time_point at, called;
  const char* waited_for;  // what the caller held it back for (null: nothing; static storage)
  static Issue Of(const CallOptions& call) {
    const Clock::time_point now = Clock::now();
    return call.issued ? Issue{std::min(*call.issued, now), now, call.waited_for} : Issue{now, now, nullptr};
  }
};

long long Ms(Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }
}  // namespace

class Communicator::Impl {
 public:
  Impl(std::shared_ptr<Store> store, int rank, int size, CommunicatorOptions options)
      : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)), meshes_(rank, size) {}

  ~Impl() {
    if (lanes_) lanes_->CloseInlineRuns();  // a Work's inline runner may outlive this
    Shutdown("communicator destroyed");
  }

  void Connect() {
    meshes_.Connect(store_, options_);
    meshes_.StartP2P(options_, [this](std::exception_ptr e) { return Fail(std::move(e)); });
    lanes_ = std::make_unique<Lanes>(meshes_.lanes());
    lanes_->StartWorkers();
    health_ = std::make_unique<PeerHealth>(store_, rank_, size_, options_);
    health_->Start();
    if (options_.cuda_device >= 0) nccl_ = CreateNccl(options_.cuda_device);
  }

  std::string Where(const std::string& op) const { return check().Where(op); }
  // The argument checks, against this communicator's size and CUDA device (once it has one).
  ArgumentChecks check() const {
    return {rank_, size_, options_.cuda_device >= 0 ? options_.cuda_device : (nccl_ ? nccl_->device() : -1)};
  }

  // Schedule: the collective (its seq assigned here) goes to its lane with the memory it
  // touches; the lane runs the plan's CPU path (on Gloo) or CUDA path (launched on NCCL) after
  // the signature check, or an eager CPU collective within the check (collective_plan.h).
  std::shared_ptr<Work> Submit(CollectivePlan plan, const CallOptions& call) {
    OpSpec& spec = plan.spec;
    failure_.ThrowIfUnusable(Where(OpKindName(spec.kind)));
    if (spec.device.is_cuda()) plan.footprint.fence = true;  // NCCL needs its launches in one order on every rank
    std::shared_ptr<Work> work;
    const bool queued = lanes_->Enqueue(std::move(plan.footprint), [&](uint64_t seq) {
      spec.seq = seq;
      collective_payload_bytes_ += plan.payload_bytes;
      const std::string description = absl::StrCat(spec.Describe(), " on rank ", rank_, " of ", size_);
      LaneLink* lane = &meshes_.lane(lanes_->LaneOf(seq));
      if (spec.device.is_cuda()) {
        auto staged = std::make_shared<StagedWork>(description);
        work = staged;
        return CudaTask(spec, *lane, staged, description, std::move(plan.cuda), call);
      }
      auto completion = std::make_shared<CompletionWork>(description);
      completion->SetInlineRunner(lanes_->InlineRunner(seq));
      work = completion;
      const bool deferred_check = plan.checks_itself && options_.verify_collectives && !plan.eager.finish;
      return CpuTask(spec, *lane, completion, std::move(plan.cpu), std::move(plan.eager), deferred_check, call);
    });
    if (!queued) throw AbortedError(absl::StrCat(Where(OpKindName(spec.kind)), ": ", failure_.stop_reason()));
    return work;
  }

  Lanes::Task CpuTask(const OpSpec& spec, LaneLink& lane, std::shared_ptr<CompletionWork> work, CpuPath cpu,
                      EagerPlan eager, bool deferred_check, const CallOptions& call) {
    return [this, &lane, spec, work, deferred_check, issued = Issue::Of(call), cpu = std::move(cpu),
            eager = std::move(eager)] {
      work->Complete(Run(
          spec, lane, issued,
          [&](Clock::time_point deadline) {
            if (eager.finish) return eager.finish(*lane.handshake, lane.scratch);
            StagedHandshake staged(*lane.handshake, spec, deadline);
            cpu(GlooCall{lane.context, static_cast<uint32_t>(spec.seq), deadline, &lane.scratch, &meshes_.retired(),
                         deferred_check ? &staged : nullptr, options_.lossless_float32_allreduce, &lane.streams,
                         meshes_.hierarchy()});
          },
          eager, deferred_check));
    };
  }

  Lanes::Task CudaTask(const OpSpec& spec, LaneLink& lane, std::shared_ptr<StagedWork> work, std::string description,
                       CudaPath cuda, const CallOptions& call) {
    // Issued now: the point in the caller's stream that the launch must follow.
    std::shared_ptr<StreamPoint> point = StreamPoint::Record(spec.device.index, call.cuda_stream, description);
    return [this, &lane, spec, work, description, point, issued = Issue::Of(call), cuda = std::move(cuda)] {
      std::shared_ptr<Work> launched;
      std::exception_ptr error = Run(spec, lane, issued, [&](Clock::time_point) {
        NcclTransport& nccl = NcclFor(spec.device.index);
        absl::MutexLock launch_lock(&nccl_mu_);
        nccl.FollowNext(point);
        launched = cuda(nccl, description);
      });
      if (error) {
        work->Fail(error);
      } else {
        work->SetLaunched(std::move(launched));
      }
    };
  }

  // Run: one queued collective, on the lane's thread or a waiting one; returns its error.
  // Transport failures poison the communicator; mismatches do not (no data moved). The deadline
  // is the timeout after the collective was `issued` (Issue), counted once: every wait of its
  // signature check and data exchange ends by it (`body`'s argument: GlooCall::deadline, each
  // Gloo wait given what is left then), one whose turn comes after it fails without starting,
  // and one whose check ends after it fails without exchanging data.
  std::exception_ptr Run(const OpSpec& spec, LaneLink& lane, const Issue& issued,
                         const std::function<void(Clock::time_point deadline)>& body, const EagerPlan& eager = {},
                         bool body_runs_check = false) {
    if (auto aborted = failure_.NotStarted(absl::StrCat(spec.Describe(), " on rank ", rank_))) return aborted;
    const std::string where = absl::StrCat(spec.Describe(), " on rank ", rank_, " of ", size_);
    try {
      const auto now = Clock::now();
      const Clock::time_point deadline = issued.at + options_.timeout;
      if (now >= deadline) {
        // Skipping it would desynchronise the ranks: a timeout like any other (poisons).
        const std::string held = issued.waited_for == nullptr ? std::string()
            : absl::StrCat("was held ", Ms(issued.called - issued.at), " ms before it reached the communicator (",
                           issued.waited_for, "), then ");
        throw TimeoutError(absl::StrCat(where, ": not started within the timeout (", options_.timeout.count(),
                                        " ms) of its issue: it ", held, "queued for ", Ms(now - issued.called),
                                        " ms behind earlier collectives (on its lane, or touching its memory)"));
      }
      // An eager collective's data travels in the handshake, so it always runs.
      if ((options_.verify_collectives || eager.finish) && !body_runs_check) {
        lane.handshake->Run(spec, eager.payload, deadline);
        // The check took the rest of the timeout (a late peer's header): no data exchange may
        // start (an eager collective's data is already in). Its peers fail theirs at their own
        // deadlines, as with any timeout.
        if (!eager.finish && Clock::now() >= deadline) {
          throw TimeoutError(absl::StrCat(where, ": timed out (", options_.timeout.count(),
                                          " ms from its issue) in its signature check: it ended ",
                                          Ms(Clock::now() - issued.at),
                                          " ms after the issue, with nothing left for the data exchange"));
        }
      }
      body(deadline);
      return nullptr;
    } catch (const MismatchError&) {
      return std::current_exception();
    } catch (const InvalidArgumentError&) {
      return std::current_exception();
    } catch (const CommError&) {
      return Fail(std::current_exception());
    } catch (const std::exception& e) {
      try {
        RethrowGlooError(where, e);
      } catch (...) {
        return Fail(std::current_exception());
      }
    }
  }

  // A transport failure: the peer check appended (unless this rank is shutting down, which is
  // then the cause), and the communicator poisoned. Returns the error to report.
  std::exception_ptr Fail(std::exception_ptr error) {
    if (!failure_.stopping() && health_) error = health_->Annotate(std::move(error));
    failure_.Poison(error);
    return error;
  }

  std::unique_ptr<NcclTransport> CreateNccl(int device) {
    return NcclTransport::Create(std::make_shared<PrefixStore>("nccl", store_), rank_, size_, device,
                                 options_.timeout);
  }

  // CUDA collectives only: they are fences (Footprint), so they run one at a time, in issue
  // order, which makes the lazy creation collective.
  NcclTransport& NcclFor(int device) {
    if (!nccl_) nccl_ = CreateNccl(device);
    return *nccl_;
  }

  // Point-to-point: validated by the caller; posted at once on the caller's thread (Gloo) or
  // launched on NCCL.
  std::shared_ptr<Work> PostP2P(absl::Span<const P2POp> ops, const std::string& description, bool cuda,
                                const CallOptions& call) {
    failure_.ThrowIfUnusable(description);
    if (cuda) {
      if (!nccl_) {
        throw InvalidArgumentError(absl::StrCat(description,
                                                ": point-to-point on CUDA needs CommunicatorOptions::cuda_device set "
                                                "(GOSSIPCC_CUDA_DEVICE for the c10d backend) or a CUDA collective "
                                                "first: the NCCL communicator must be created collectively"));
      }
      absl::MutexLock launch_lock(&nccl_mu_);
      nccl_->FollowNext(StreamPoint::Record(nccl_->device(), call.cuda_stream, description));
      return nccl_->P2P(ops, description);
    }
    try {
      // Held while posting, so that Shutdown cannot free the exchange under a Post in flight.
      absl::ReaderMutexLock post_lock(&p2p_post_mu_);
      if (p2p_closed_) throw AbortedError(absl::StrCat(description, ": ", failure_.stop_reason()));
      const Issue issued = Issue::Of(call);
      if (issued.at + options_.timeout <= issued.called) {
        // Nothing left: fails before anything is posted, as a collective does (and poisons).
        throw TimeoutError(absl::StrCat(description, ": not started within the timeout (", options_.timeout.count(),
                                        " ms) of its issue: it was held ", Ms(issued.called - issued.at),
                                        " ms before it reached the communicator (",
                                        issued.waited_for ? issued.waited_for : "by the caller", ")"));
      }
      return meshes_.p2p()->Post(ops, issued.waited_for ? absl::StrCat(description, " (held back for ", issued.waited_for,
                                                                        " before the call)")
                                                        : description,
                                 issued.at);
    } catch (const AbortedError&) {
      throw;
    } catch (const CommError&) {
      // Posting to a peer whose connection is already closed fails here, synchronously: the
      // same failure as in a batch, so the same peer check and the same poisoning.
      std::rethrow_exception(Fail(std::current_exception()));
    }
  }

  // Pending collectives fail with AbortedError, running ones finish (bounded by their timeout),
  // then every thread is joined and the meshes closed (Meshes::Close has the order and why).
  void Shutdown(const std::string& reason) {
    if (!failure_.Stop(reason)) return;
    if (lanes_) {
      for (auto& never_started : lanes_->Stop()) never_started();  // Run sees the failure: AbortedError
    }
    if (health_) health_->Stop();  // and says "down", so peers that fail next name this rank as shut down
    if (meshes_.p2p()) meshes_.p2p()->Shutdown(failure_.stop_reason());
    {
      absl::MutexLock post_lock(&p2p_post_mu_);  // waits for Posts in flight; later ones see p2p_closed_
      p2p_closed_ = true;
    }
    if (lanes_) lanes_->Join();
    nccl_.reset();
    meshes_.Close();
  }

  // With the buffers of failed operations (Meshes::Close frees them after the pairs).
  void KeepUntilClosed(std::shared_ptr<void> memory) { meshes_.retired().Add(std::move(memory)); }

  const Topology& topology() const { return meshes_.topology(); }
  bool hierarchical() const { return meshes_.hierarchy() != nullptr; }

  TrafficCounters traffic() const {
    TrafficCounters t;
    t.collective_payload_bytes = collective_payload_bytes_.load(std::memory_order_relaxed);
    if (const P2PExchange* p2p = meshes_.p2p()) {
      t.p2p_bytes_sent = p2p->bytes_sent();
      t.p2p_bytes_received = p2p->bytes_received();
    }
    for (int i = 0; i < meshes_.lanes(); ++i) {
      t.packed_allreduce_raw_bytes += meshes_.lane(i).scratch.packed_raw_bytes.load(std::memory_order_relaxed);
      t.packed_allreduce_wire_bytes += meshes_.lane(i).scratch.packed_wire_bytes.load(std::memory_order_relaxed);
    }
    return t;
  }

  std::vector<int> UnresponsivePeers() { return health_ ? health_->UnresponsivePeers() : std::vector<int>{}; }

  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const CommunicatorOptions options_;

 private:
  // Destroyed in reverse: lanes (their tasks use everything else) first, meshes last.
  Meshes meshes_;
  // Point-to-point posts (readers) against Shutdown, which sets p2p_closed_ before the meshes close.
  absl::Mutex p2p_post_mu_;
  bool p2p_closed_ ABSL_GUARDED_BY(p2p_post_mu_) = false;
  std::unique_ptr<NcclTransport> nccl_;
  absl::Mutex nccl_mu_;  // NCCL calls on one communicator must not interleave across threads
  FailureState failure_;
  std::unique_ptr<PeerHealth> health_;
  std::unique_ptr<Lanes> lanes_;
  std::atomic<uint64_t> collective_payload_bytes_{0};
};

namespace {
size_t Sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }
}  // namespace

std::unique_ptr<Communicator> Communicator::Create(std::shared_ptr<Store> store, int rank, int size,
                                                   CommunicatorOptions options) {
  if (size < 1) throw InvalidArgumentError(absl::StrCat("Communicator: size must be >= 1, got ", size));
  if (rank < 0 || rank >= size) {
    throw InvalidArgumentError(absl::StrCat("Communicator: rank ", rank, " is out of range [0, ", size, ")"));
  }
  if (!store) throw InvalidArgumentError("Communicator: store is null");
  ValidateCommunicatorOptions(options);
  auto impl = std::make_unique<Impl>(std::move(store), rank, size, std::move(options));
  impl->Connect();
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank_; }
int Communicator::size() const { return impl_->size_; }
const CommunicatorOptions& Communicator::options() const { return impl_->options_; }
void Communicator::shutdown() { impl_->Shutdown("shutdown() called"); }
void Communicator::KeepUntilClosed(std::shared_ptr<void> memory) { impl_->KeepUntilClosed(std::move(memory)); }
TrafficCounters Communicator::traffic() const { return impl_->traffic(); }
const Topology& Communicator::topology() const { return impl_->topology(); }
bool Communicator::hierarchical() const { return impl_->hierarchical(); }
std::vector<int> Communicator::UnresponsivePeers() { return impl_->UnresponsivePeers(); }

// ---- collectives: check, describe (collective_plan.h), then Submit schedules and runs ----

std::shared_ptr<Work> Communicator::allreduce(Buffer data, ReduceOp op, const CallOptions& call) {
  impl_->check().Buffer("allreduce", "data", data);
  impl_->check().Reduce("allreduce", data, op);
  return impl_->Submit(PlanAllreduce(size(), data, op), call);
}

std::shared_ptr<Work> Communicator::broadcast(Buffer data, int root, const CallOptions& call) {
  impl_->check().Buffer("broadcast", "data", data);
  impl_->check().Peer("broadcast", root, "root");
  return impl_->Submit(PlanBroadcast(rank(), size(), data, root), call);
}

std::shared_ptr<Work> Communicator::allgather(Buffer input, Buffer output, const CallOptions& call) {
  impl_->check().Buffer("allgather", "input", input);
  impl_->check().Buffer("allgather", "output", output);
  impl_->check().Same("allgather", input, output);
  if (output.count != input.count * size()) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("allgather"), ": output has ", output.count,
                                            " elements but size() * input.count = ", size(), " * ", input.count,
                                            " = ", input.count * size(), " are required"));
  }
  return impl_->Submit(PlanAllgather(size(), input, output), call);
}

std::shared_ptr<Work> Communicator::allgatherv(Buffer input, Buffer output, std::vector<size_t> counts,
                                               const CallOptions& call) {
  impl_->check().Buffer("allgatherv", "input", input);
  impl_->check().Buffer("allgatherv", "output", output);
  impl_->check().Same("allgatherv", input, output);
  impl_->check().Counts("allgatherv", "counts", counts);
  if (input.count != counts[rank()]) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("allgatherv"), ": input has ", input.count,
                                            " elements but counts[", rank(), "] = ", counts[rank()]));
  }
  const size_t total = Sum(counts);
  if (output.count != total) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("allgatherv"), ": output has ", output.count,
                                            " elements but the counts add up to ", total));
  }
  return impl_->Submit(PlanAllgatherv(size(), input, output, std::move(counts)), call);
}

std::shared_ptr<Work> Communicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                                   const CallOptions& call) {
  impl_->check().Buffer("reduce_scatter", "input", input);
  impl_->check().Buffer("reduce_scatter", "output", output);
  impl_->check().Same("reduce_scatter", input, output);
  impl_->check().Reduce("reduce_scatter", input, op);
  if (input.count != output.count * size()) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("reduce_scatter"), ": input has ", input.count,
                                            " elements but size() * output.count = ", size(), " * ", output.count,
                                            " = ", output.count * size(), " are required"));
  }
  return impl_->Submit(PlanReduceScatter(rank(), size(), input, output, op), call);
}

std::shared_ptr<Work> Communicator::alltoall(Buffer input, Buffer output, const CallOptions& call) {
  impl_->check().Buffer("alltoall", "input", input);
  impl_->check().Buffer("alltoall", "output", output);
  impl_->check().Same("alltoall", input, output);
  if (input.count != output.count || input.count % size() != 0) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("alltoall"), ": input (", input.count, ") and output (",
                                            output.count, ") must have the same element count, a multiple of size() = ",
                                            size()));
  }
  return impl_->Submit(PlanAlltoall(size(), input, output), call);
}

std::shared_ptr<Work> Communicator::alltoallv(Buffer input, std::vector<size_t> send_counts, Buffer output,
                                              std::vector<size_t> recv_counts, const CallOptions& call) {
  impl_->check().Buffer("alltoallv", "input", input);
  impl_->check().Buffer("alltoallv", "output", output);
  impl_->check().Same("alltoallv", input, output);
  impl_->check().Counts("alltoallv", "send_counts", send_counts);
  impl_->check().Counts("alltoallv", "recv_counts", recv_counts);
  if (Sum(send_counts) != input.count || Sum(recv_counts) != output.count) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("alltoallv"), ": send_counts add up to ", Sum(send_counts),
                                            " (input has ", input.count, "), recv_counts add up to ", Sum(recv_counts),
                                            " (output has ", output.count, ")"));
  }
  return impl_->Submit(PlanAlltoallv(input, std::move(send_counts), output, std::move(recv_counts)), call);
}

std::shared_ptr<Work> Communicator::barrier(const CallOptions& call) { return impl_->Submit(PlanBarrier(size()), call); }

// ---- point-to-point: check, then post at once ----

namespace {
// `any_source`: receives may name kAnySource (recv_any_source and p2p batches).
std::shared_ptr<Work> CheckAndPost(Communicator::Impl& c, absl::Span<const P2POp> ops, const CallOptions& call,
                                   bool any_source = true) {
  if (ops.empty()) {
    auto work = std::make_shared<CompletionWork>(c.Where("p2p (empty batch)"));
    work->Complete(nullptr);
    return work;
  }
  const std::string description = c.check().P2P(ops, any_source);
  return c.PostP2P(ops, description, ops[0].buffer.device.is_cuda(), call);
}
}  // namespace

std::shared_ptr<Work> Communicator::send(Buffer data, int peer, uint32_t tag, const CallOptions& call) {
  P2POp op = P2POp::Send(data, peer, tag);
  return CheckAndPost(*impl_, absl::MakeConstSpan(&op, 1), call);
}

std::shared_ptr<Work> Communicator::recv(Buffer data, int peer, uint32_t tag, const CallOptions& call) {
  P2POp op = P2POp::Recv(data, peer, tag);
  return CheckAndPost(*impl_, absl::MakeConstSpan(&op, 1), call, /*any_source=*/false);
}

std::shared_ptr<Work> Communicator::recv_any_source(Buffer data, uint32_t tag, int* source, const CallOptions& call) {
  P2POp op = P2POp::Recv(data, kAnySource, tag, source);
  return CheckAndPost(*impl_, absl::MakeConstSpan(&op, 1), call);
}

std::shared_ptr<Work> Communicator::p2p(absl::Span<const P2POp> ops, const CallOptions& call) {
  return CheckAndPost(*impl_, ops, call);
}

}  // namespace gossipcc
