#include "comm/communicator.h"

#include <gloo/context.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "comm/consistency_check.h"
#include "comm/eager_collectives.h"
#include "comm/errors.h"
#include "comm/gloo_collectives.h"
#include "comm/gloo_util.h"
#include "comm/nccl_transport.h"
#include "comm/op_spec.h"
#include "comm/p2p_exchange.h"
#include "comm/reduce.h"

namespace gossipcc {
namespace {

using Clock = std::chrono::steady_clock;

// A CUDA collective's Work: first the CPU stage (signature check, then the NCCL launch on
// its lane's worker thread), then the launched operation's own completion.
class StagedWork : public Work {
 public:
  explicit StagedWork(std::string description) : stage_(description), description_(std::move(description)) {}

  void SetLaunched(std::shared_ptr<Work> launched) {
    {
      absl::MutexLock lock(&mu_);
      launched_ = std::move(launched);
    }
    stage_.Complete(nullptr);
  }
  void Fail(std::exception_ptr error) { stage_.Complete(std::move(error)); }

  bool is_completed() override {
    if (!stage_.is_completed()) return false;
    auto launched = Launched();
    return launched == nullptr || launched->is_completed();
  }
  void wait(std::chrono::milliseconds timeout) override {
    const auto start = Clock::now();
    stage_.wait(timeout);
    auto launched = Launched();
    if (launched == nullptr) return;
    auto left = timeout;
    if (timeout.count() > 0) {
      left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      if (left.count() <= 0) left = std::chrono::milliseconds(1);
    }
    launched->wait(left);
  }
  std::exception_ptr exception() override {
    if (auto e = stage_.exception()) return e;
    auto launched = Launched();
    return launched ? launched->exception() : nullptr;
  }
  void add_done_callback(std::function<void()> fn) override {
    stage_.add_done_callback([this, fn = std::move(fn)]() mutable {
      auto launched = Launched();
      if (launched) {
        launched->add_done_callback(std::move(fn));
      } else {
        fn();
      }
    });
  }
  const std::string& description() const override { return description_; }

 private:
  std::shared_ptr<Work> Launched() {
    absl::MutexLock lock(&mu_);
    return launched_;
  }
  CompletionWork stage_;
  const std::string description_;
  absl::Mutex mu_;
  std::shared_ptr<Work> launched_ ABSL_GUARDED_BY(mu_);
};

size_t Sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

// Set when the process starts exiting. A Python job usually exits without destroying its
// process group, so its communicator's heartbeat thread is still running while exit() runs
// static destructors; from then on the thread must not touch the store (or anything else).
std::atomic<bool> g_process_exiting{false};

void StopHeartbeatsAtExit() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit([] { g_process_exiting.store(true); }); });
}

}  // namespace

// The tag of the all-gather that checks the mesh layout at creation, before any collective
// (whose tags count up from 0).
constexpr uint32_t kMeshLayoutTag = 0xffffffffu;

class Communicator::Impl {
 public:
  // The memory a collective touches (its buffers' byte ranges, all taken as written), or a
  // fence, which conflicts with every collective. A collective starts only once no earlier
  // collective it conflicts with is in flight, so lanes never change a result.
  struct Footprint {
    bool fence = false;
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // [begin, end), non-empty

    static Footprint Fence() { return Footprint{true, {}}; }
    static Footprint Of(std::initializer_list<Buffer> buffers) {
      Footprint f;
      for (const Buffer& b : buffers) {
        if (b.bytes() == 0) continue;
        const auto begin = reinterpret_cast<uintptr_t>(b.data);
        f.ranges.emplace_back(begin, begin + b.bytes());
      }
      return f;
    }
    bool Conflicts(const Footprint& other) const {
      if (fence || other.fence) return true;
      for (const auto& [b1, e1] : ranges) {
        for (const auto& [b2, e2] : other.ranges) {
          if (b1 < e2 && b2 < e1) return true;
        }
      }
      return false;
    }
  };

  struct QueuedTask {
    uint64_t seq;
    std::function<void()> run;
  };

  // Collectives k with k % lanes == index run here, one at a time, in issue order.
  struct Lane {
    explicit Lane(Impl* owner) : impl(owner) {}
    Impl* const impl;  // for the worker's wait condition
    std::shared_ptr<gloo::Context> context;  // lane 0: the communicator's first mesh
    std::shared_ptr<gloo::Context> signature_context;  // the handshake's mesh (headers only)
    // Its staging memory outlives context (see Shutdown); declared after signature_context,
    // which it refers to, so that it is destroyed first.
    std::unique_ptr<CollectiveHandshake> handshake;
    CollectiveScratch scratch;  // for the one collective this lane runs at a time
    std::deque<QueuedTask> queue;  // guarded by impl->mu_
    bool running = false;          // guarded by impl->mu_: a collective runs (worker or inline)
    std::thread worker;
  };

  Impl(std::shared_ptr<Store> store, int rank, int size, CommunicatorOptions options)
      : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)) {}

  ~Impl() {
    {
      // Waits for waiters running an operation inline (they hold the gate shared).
      absl::MutexLock lock(&gate_->mu);
      gate_->impl = nullptr;
    }
    Shutdown("communicator destroyed");
  }

  void Connect() {
    // One deadline for every mesh of this communicator: Create ends within the rendezvous time.
    const auto rendezvous =
        options_.rendezvous_timeout.count() > 0 ? options_.rendezvous_timeout : options_.timeout;
    const GlooMeshOptions mesh{options_.hostname, options_.interface, options_.timeout, Clock::now() + rendezvous};
    context_ = ConnectGlooMesh(std::make_shared<PrefixStore>("gloo", store_), rank_, size_, mesh);
    meshes_.push_back(context_);
    if (size_ > 1) CheckSharedOptionsAgree();
    // Lane 0 runs on the first mesh; every further lane on a mesh of its own (on the same
    // device: one listening socket and event loop), so that a lane's messages never queue
    // behind another lane's payload on one socket.
    const int lanes = size_ == 1 ? 1 : options_.collective_lanes;
    for (int i = 0; i < lanes; ++i) {
      auto lane = std::make_unique<Lane>(this);
      lane->context = i == 0 ? context_
                             : ConnectGlooMesh(std::make_shared<PrefixStore>(absl::StrCat("gloo_lane", i), store_),
                                               rank_, size_, mesh, context_->getDevice());
      if (i > 0) meshes_.push_back(lane->context);
      // The signature check on a mesh of its own: its headers are writes into bound buffers,
      // and Gloo sizes a socket's send buffer to the first such write (and so pins it, ending
      // the kernel's autotuning), which would throttle any payload sharing that socket.
      lane->signature_context =
          size_ == 1 ? lane->context
                     : ConnectGlooMesh(std::make_shared<PrefixStore>(absl::StrCat("gloo_signatures", i), store_),
                                       rank_, size_, mesh, context_->getDevice());
      if (size_ > 1) meshes_.push_back(lane->signature_context);
      lane->handshake = std::make_unique<CollectiveHandshake>(*lane->signature_context);
      lanes_.push_back(std::move(lane));
    }
    std::array<std::shared_ptr<gloo::Context>, 2> payload_contexts;
    if (options_.p2p_connection_per_direction && size_ > 1) {
      // On the collectives' device: one listening socket and event loop for all the meshes.
      // (Lower-to-higher payloads on the collectives' mesh instead of a third one connect
      // faster, ~250 vs ~400 ms at n = 8, but headers then queue behind payloads: SGP, D-PSGD
      // and AD-PSGD steps at 100 Mbit/s were 3-5% slower, 2026-11-22.)
      payload_contexts[0] =
          ConnectGlooMesh(std::make_shared<PrefixStore>("gloo_p2p_up", store_), rank_, size_, mesh,
                          context_->getDevice());
      payload_contexts[1] =
          ConnectGlooMesh(std::make_shared<PrefixStore>("gloo_p2p_down", store_), rank_, size_, mesh,
                          context_->getDevice());
      meshes_.insert(meshes_.end(), payload_contexts.begin(), payload_contexts.end());
    }
    p2p_ = std::make_unique<P2PExchange>(context_, std::move(payload_contexts), options_.timeout,
                                         options_.p2p_segment_bytes, retired_buffers_, [this](std::exception_ptr e) {
      e = Annotate(std::move(e));
      Poison(e);
      return e;
    });
    for (auto& lane : lanes_) lane->worker = std::thread([this, l = lane.get()] { WorkerLoop(*l); });
    StartHeartbeat();
    if (options_.cuda_device >= 0) nccl_ = CreateNccl(options_.cuda_device);
  }

  // Options every rank must share, settled by one all-gather on the fresh mesh: a rank that
  // connects a mesh a peer does not (p2p_connection_per_direction, collective_lanes), or sends
  // its all-reduces on another ring (lossless_float32_allreduce: packed messages travel on a
  // slot of their own), would otherwise wait out the timeout at its first use.
  void CheckSharedOptionsAgree() {
    struct Agreed {
      const char* name;
      bool is_flag;  // shown as true/false, else as a number
    };
    static constexpr std::array<Agreed, 3> kAgreed = {{{"p2p_connection_per_direction", true},
                                                       {"collective_lanes", false},
                                                       {"lossless_float32_allreduce", true}}};
    const std::array<uint8_t, kAgreed.size()> mine = {
        static_cast<uint8_t>(options_.p2p_connection_per_direction ? 1 : 0),
        static_cast<uint8_t>(options_.collective_lanes),
        static_cast<uint8_t>(options_.lossless_float32_allreduce ? 1 : 0)};
    std::vector<uint8_t> all(mine.size() * size_);
    CollectiveScratch scratch;
    try {
      GlooAllgather(GlooCall{context_, kMeshLayoutTag, options_.timeout, &scratch, &retired_buffers_},
                    Buffer{const_cast<uint8_t*>(mine.data()), mine.size(), DType::kUInt8, Device::CPU()},
                    Buffer{all.data(), all.size(), DType::kUInt8, Device::CPU()});
    } catch (const std::exception& e) {
      RethrowGlooError(Where("agreeing on the connection layout"), e);
    }
    auto show = [](size_t field, uint8_t value) {
      return kAgreed[field].is_flag ? std::string(value ? "true" : "false") : absl::StrCat(value);
    };
    for (size_t field = 0; field < mine.size(); ++field) {
      std::map<uint8_t, std::vector<int>> ranks_by_value;  // of the ranks that differ from this one
      for (int r = 0; r < size_; ++r) {
        const uint8_t theirs = all[static_cast<size_t>(r) * mine.size() + field];
        if (theirs != mine[field]) ranks_by_value[theirs].push_back(r);
      }
      std::vector<std::string> others;  // "false on rank(s) 0, 1"
      for (const auto& [value, ranks] : ranks_by_value) {
        others.push_back(absl::StrCat(show(field, value), " on rank(s) ", absl::StrJoin(ranks, ", ")));
      }
      if (!others.empty()) {
        throw InvalidArgumentError(absl::StrCat(Where("Communicator::Create"), ": CommunicatorOptions::", kAgreed[field].name,
                                                " is ", show(field, mine[field]), " here but ",
                                                absl::StrJoin(others, "; "), "; every rank must use the same setting"));
      }
    }
  }

  // ---- argument checks (synchronous, InvalidArgumentError) ----

  std::string Where(const char* op) const { return absl::StrCat("rank ", rank_, " of ", size_, ": ", op); }

  void CheckBuffer(const char* op, const char* name, const Buffer& b) const {
    if (b.data == nullptr && b.count > 0) {
      throw InvalidArgumentError(absl::StrCat(Where(op), ": ", name, " is null but has ", b.count, " elements"));
    }
    if (static_cast<int>(b.dtype) < 0 || static_cast<int>(b.dtype) >= kNumDTypes) {
      throw InvalidArgumentError(absl::StrCat(Where(op), ": ", name, " has an invalid dtype"));
    }
    if (b.device.is_cuda()) {
      if (b.device.index < 0) {
        throw InvalidArgumentError(absl::StrCat(Where(op), ": ", name, " is on CUDA without a device ordinal"));
      }
      const int visible = NcclTransport::DeviceCount();
      if (b.device.index >= visible) {
        throw InvalidArgumentError(absl::StrCat(Where(op), ": ", name, " is on ", b.device.ToString(), " but ",
                                                visible, " CUDA device(s) are visible",
                                                visible == 0 ? " (no GPU, no driver, or built without CUDA)" : ""));
      }
      const int bound = options_.cuda_device >= 0 ? options_.cuda_device : (nccl_ ? nccl_->device() : -1);
      if (bound >= 0 && b.device.index != bound) {
        throw InvalidArgumentError(absl::StrCat(Where(op), ": ", name, " is on ", b.device.ToString(),
                                                " but this communicator uses cuda:", bound));
      }
    } else if (b.device.index != -1) {
      throw InvalidArgumentError(absl::StrCat(Where(op), ": ", name, " is a CPU buffer with device index ",
                                              b.device.index));
    }
  }

  void CheckSame(const char* op, const Buffer& a, const Buffer& b) const {
    if (a.dtype != b.dtype) {
      throw InvalidArgumentError(absl::StrCat(Where(op), ": input is ", DTypeName(a.dtype), " but output is ",
                                              DTypeName(b.dtype)));
    }
    if (a.device != b.device) {
      throw InvalidArgumentError(absl::StrCat(Where(op), ": input is on ", a.device.ToString(), " but output is on ",
                                              b.device.ToString()));
    }
  }

  void CheckPeer(const char* op, int peer, const char* what) const {
    if (peer < 0 || peer >= size_) {
      throw InvalidArgumentError(absl::StrCat(Where(op), ": ", what, " ", peer, " is out of range [0, ", size_, ")"));
    }
  }

  void CheckCounts(const char* op, const char* name, const std::vector<size_t>& counts) const {
    if (counts.size() != static_cast<size_t>(size_)) {
      throw InvalidArgumentError(absl::StrCat(Where(op), ": ", name, " has ", counts.size(),
                                              " entries; one per rank (", size_, ") is required"));
    }
  }

  // ---- collectives ----

  // A CPU collective small enough to travel inside the signature handshake
  // (consistency_check.h): `payload` rides with this rank's header, and `finish` completes the
  // collective from every rank's payload. A null `finish`: not eager.
  using EagerFinish = std::function<void(const CollectiveHandshake&, CollectiveScratch&)>;
  struct EagerPlan {
    absl::Span<const uint8_t> payload;
    EagerFinish finish;  // gets the lane's handshake and scratch
  };

  // The eager plan of a CPU collective whose largest per-rank payload is `bytes` (the same on
  // every rank), or no plan (not eager) when it does not fit.
  EagerPlan Eager(const Device& device, size_t bytes, absl::Span<const uint8_t> payload, EagerFinish finish) const {
    if (size_ == 1 || device.is_cuda() || bytes > EagerCollectiveMaxBytes(size_)) return {};
    return {payload, std::move(finish)};
  }

  // Queues a collective on its lane: the lane checks the signature across ranks, then runs
  // `cpu` (CPU buffers, on Gloo) or `cuda` (CUDA buffers, launched on NCCL); an eager CPU
  // collective completes within the check instead. `footprint`: the memory it touches.
  std::shared_ptr<Work> Submit(OpSpec spec, Footprint footprint, std::function<void(const GlooCall&)> cpu,
                               std::function<std::shared_ptr<Work>(NcclTransport&, std::string)> cuda,
                               uint64_t payload_bytes, EagerPlan eager = {}, bool checks_itself = false) {
    absl::MutexLock lock(&mu_);
    if (stopping_) throw AbortedError(absl::StrCat(Where(OpKindName(spec.kind)), ": ", stop_reason_));
    if (first_failure_) {
      throw AbortedError(absl::StrCat(Where(OpKindName(spec.kind)), ": communicator unusable after an earlier failure: ",
                                      failure_text_));
    }
    spec.seq = next_seq_++;
    traffic_.collective_payload_bytes += payload_bytes;
    // NCCL needs its launches in the same order on every rank.
    if (spec.device.is_cuda()) footprint.fence = true;
    in_flight_.emplace(spec.seq, std::move(footprint));
    Lane* lane = &LaneOf(spec.seq);
    const std::string description = absl::StrCat(spec.Describe(), " on rank ", rank_, " of ", size_);
    if (!spec.device.is_cuda()) {
      auto work = std::make_shared<CompletionWork>(description);
      work->SetInlineRunner([gate = gate_, seq = spec.seq] {
        absl::ReaderMutexLock lock(&gate->mu);
        if (gate->impl) gate->impl->TryRunInline(seq);
      });
      // `cpu` runs the signature check itself, overlapped with its first messages.
      const bool deferred = checks_itself && options_.verify_collectives && !eager.finish;
      lane->queue.push_back(
          {spec.seq, [this, lane, spec, work, deferred, issued = Clock::now(), cpu = std::move(cpu),
                      eager = std::move(eager)] {
             work->Complete(Run(
                 spec, *lane, issued,
                 [&](std::chrono::milliseconds left) {
                   if (eager.finish) {
                     eager.finish(*lane->handshake, lane->scratch);
                   } else {
                     StagedHandshake staged(*lane->handshake, spec, left);
                     cpu(GlooCall{lane->context, static_cast<uint32_t>(spec.seq), left, &lane->scratch,
                                  &retired_buffers_, deferred ? &staged : nullptr,
                                  options_.lossless_float32_allreduce});
                   }
                 },
                 eager, deferred));
           }});
      return work;
    }
    auto work = std::make_shared<StagedWork>(description);
    lane->queue.push_back({spec.seq, [this, lane, spec, work, description, issued = Clock::now(), cuda = std::move(cuda)] {
      std::shared_ptr<Work> launched;
      std::exception_ptr error = Run(spec, *lane, issued, [&](std::chrono::milliseconds) {
        NcclTransport& nccl = NcclFor(spec.device.index);
        absl::MutexLock launch_lock(&nccl_mu_);
        launched = cuda(nccl, description);
      });
      if (error) {
        work->Fail(error);
      } else {
        work->SetLaunched(std::move(launched));
      }
    }});
    return work;
  }

  // ---- lanes: which collective may run when ----

  Lane& LaneOf(uint64_t seq) { return *lanes_[seq % lanes_.size()]; }

  // Whether collective `seq` must wait for an earlier one that has not completed.
  bool WaitsForEarlier(uint64_t seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Footprint& mine = in_flight_.at(seq);
    for (const auto& [earlier, footprint] : in_flight_) {
      if (earlier >= seq) break;
      if (mine.Conflicts(footprint)) return true;
    }
    return false;
  }

  // The lane is idle and the collective at its front may start.
  bool Ready(const Lane& lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !lane.running && !lane.queue.empty() && !WaitsForEarlier(lane.queue.front().seq);
  }

  // Runs queued collective `seq` on the calling thread if it is next in its lane and may start
  // (the lane idle, no overlapping earlier collective pending); otherwise leaves it to the
  // lane's worker.
  void TryRunInline(uint64_t seq) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    Lane& lane = LaneOf(seq);
    if (lane.running || lane.queue.empty() || lane.queue.front().seq != seq || WaitsForEarlier(seq)) return;
    RunFront(lane);
  }

  // Takes the task at the lane's front and runs it with mu_ released; the lane stays busy
  // until it returns, and the collective counts as in flight until then. Called with mu_
  // held; returns with it held.
  void RunFront(Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    QueuedTask task = std::move(lane.queue.front());
    lane.queue.pop_front();
    lane.running = true;
    mu_.Unlock();
    task.run();
    mu_.Lock();
    lane.running = false;
    in_flight_.erase(task.seq);
  }

  // Runs one queued collective on `lane`; returns its error. Transport failures poison the
  // communicator; mismatches do not (no data moved). The collective's deadline is counted from
  // when it was `issued`, not from when it starts: its data exchange gets what is left of the
  // timeout (`body`'s argument), and one whose turn comes after the deadline fails without
  // starting. One wait is bounded from the start instead: the signature check's wait for a
  // peer's header, which Gloo bounds by the connection's timeout alone (its bound buffers
  // take none other), so a collective that queued and then waits for a late peer's header can
  // take up to twice the timeout from its issue.
  std::exception_ptr Run(const OpSpec& spec, Lane& lane, Clock::time_point issued,
                         const std::function<void(std::chrono::milliseconds)>& body, const EagerPlan& eager = {},
                         bool body_runs_check = false) {
    {
      absl::MutexLock lock(&mu_);
      if (first_failure_) {
        return std::make_exception_ptr(AbortedError(absl::StrCat(
            spec.Describe(), " on rank ", rank_, ": not started: communicator unusable after an earlier failure: ",
            failure_text_)));
      }
    }
    const std::string where = absl::StrCat(spec.Describe(), " on rank ", rank_, " of ", size_);
    try {
      const auto queued = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - issued);
      const auto left = options_.timeout - queued;
      if (left.count() <= 0) {
        // Skipping it would desynchronise the ranks: a timeout like any other (poisons).
        throw TimeoutError(absl::StrCat(where, ": not started within the timeout (", options_.timeout.count(),
                                        " ms) of its issue: it queued for ", queued.count(),
                                        " ms behind earlier collectives (on its lane, or touching its memory)"));
      }
      // An eager collective's data travels in the handshake, so it always runs.
      if ((options_.verify_collectives || eager.finish) && !body_runs_check) {
        lane.handshake->Run(spec, eager.payload, left);
      }
      body(left);
      return nullptr;
    } catch (const MismatchError&) {
      return std::current_exception();
    } catch (const InvalidArgumentError&) {
      return std::current_exception();
    } catch (const CommError&) {
      std::exception_ptr annotated = Annotate(std::current_exception());
      Poison(annotated);
      return annotated;
    } catch (const std::exception& e) {
      std::exception_ptr mapped;
      try {
        RethrowGlooError(where, e);
      } catch (...) {
        mapped = std::current_exception();
      }
      mapped = Annotate(mapped);
      Poison(mapped);
      return mapped;
    }
  }

  // ---- peer health: heartbeats in the store, checked when an operation fails ----

  static std::string HealthKey(int rank) { return absl::StrCat("heartbeat/", rank); }

  void StartHeartbeat() {
    const auto configured = options_.heartbeat_interval;
    if (configured.count() < 0 || size_ == 1) return;
    interval_ = configured.count() > 0
                    ? configured
                    : std::clamp(options_.timeout / 10, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
    health_store_ = std::make_shared<PrefixStore>("health", store_);
    StopHeartbeatsAtExit();
    Beat();  // before Create() returns, so a peer that fails at once finds this rank's key
    heartbeat_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(heartbeat_mu_);
      while (!heartbeat_cv_.wait_for(lock, interval_, [this] { return heartbeat_stop_; })) {
        if (g_process_exiting.load()) return;
        lock.unlock();
        Beat();
        lock.lock();
      }
    });
  }

  // Best effort: a store that is gone (its host died) must not take this rank down with it.
  void Beat() {
    std::string error = SetHealth(absl::StrCat(beats_++));
    {
      std::lock_guard<std::mutex> lock(heartbeat_mu_);
      if (error.empty()) ++beats_written_;
      heartbeat_error_ = std::move(error);
    }
    heartbeat_cv_.notify_all();  // CheckPeers counts this rank's beats (the thread's own wait ignores it)
  }
  // Returns the store's error, if any.
  std::string SetHealth(const std::string& value) {
    try {
      health_store_->set(HealthKey(rank_), std::vector<char>(value.begin(), value.end()));
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  void StopHeartbeat() {
    if (!heartbeat_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(heartbeat_mu_);
      heartbeat_stop_ = true;
    }
    heartbeat_cv_.notify_all();
    heartbeat_.join();
    if (!g_process_exiting.load()) SetHealth("down");
  }

  struct PeerHealth {
    std::vector<int> silent;  // heartbeat did not advance (or never appeared)
    std::vector<int> down;    // shut down its communicator
    std::string store_error;  // the store could not be read
    // Neither this rank's own heartbeat nor any peer's advanced enough (every thread starved,
    // or the store stalled): a peer's silence is no evidence then, and `silent` stays empty.
    bool own_heartbeat_stalled = false;
    uint64_t own_beats_in_window = 0;
  };

  // The silence window is counted in this rank's own heartbeats, not in wall time: when the
  // whole machine is starved, or the store stalls, every heartbeat stops at once, and a live
  // peer must not be named for it. Returns how many heartbeats this rank wrote after
  // `written_before`: `beats` of them, or fewer when kOwnBeatsCap intervals passed first.
  static constexpr int kWindowBeats = 4;  // the first may come at once: >= 3 full intervals
  static constexpr int kOwnBeatsCap = 6;  // intervals, so the check adds at most 6 to a failure
  // The heartbeats count as working (and a silent peer is named) if this rank beat at least
  // this often in the window, or any peer's heartbeat advanced: under sanitizers on a loaded
  // machine a rank's own heartbeats come late (2 of 4 in 6 intervals was seen in CI) while a
  // killed peer's stop for good, and that peer must still be named.
  static constexpr int kMinOwnBeats = 2;
  uint64_t AwaitOwnBeats(uint64_t written_before, uint64_t beats) {
    std::unique_lock<std::mutex> lock(heartbeat_mu_);
    heartbeat_cv_.wait_for(lock, kOwnBeatsCap * interval_, [&] { return beats_written_ >= written_before + beats; });
    return beats_written_ - written_before;
  }

  PeerHealth CheckPeers() {
    PeerHealth health;
    if (!health_store_) return health;
    auto read_all = [&](std::map<int, std::string>* out) {
      for (int r = 0; r < size_ && health.store_error.empty(); ++r) {
        if (r == rank_) continue;
        try {
          std::vector<char> v = health_store_->get(HealthKey(r), interval_);
          (*out)[r] = std::string(v.begin(), v.end());
        } catch (const TimeoutError&) {
          (*out)[r] = "";  // never wrote a heartbeat
        } catch (const std::exception& e) {
          health.store_error = e.what();
        }
      }
    };
    std::map<int, std::string> first, second;
    read_all(&first);
    uint64_t written_before;  // after the first read, so that the 4 beats all follow it
    {
      std::lock_guard<std::mutex> lock(heartbeat_mu_);
      written_before = beats_written_;
    }
    health.own_beats_in_window = AwaitOwnBeats(written_before, kWindowBeats);
    read_all(&second);
    if (!health.store_error.empty()) return health;
    // One pass: each peer is down, silent (no heartbeat, or the same one twice) or advanced.
    std::vector<int> silent;
    bool any_peer_advanced = false;
    for (const auto& [r, value] : second) {
      if (value == "down") {
        health.down.push_back(r);
      } else if (value.empty() || value == first.at(r)) {
        silent.push_back(r);
      } else {
        any_peer_advanced = true;
      }
    }
    health.own_heartbeat_stalled = health.own_beats_in_window < kMinOwnBeats && !any_peer_advanced;
    if (!health.own_heartbeat_stalled) health.silent = std::move(silent);
    return health;
  }

  // One check per communicator: concurrent failures (several p2p batches) share it.
  std::string PeerReport() {
    std::lock_guard<std::mutex> lock(report_mu_);
    if (report_done_) return report_;
    report_done_ = true;
    if (!health_store_) return report_;
    std::string own_error;
    {
      std::lock_guard<std::mutex> lock(heartbeat_mu_);
      own_error = heartbeat_error_;
    }
    if (!own_error.empty()) {
      // E.g. a write-once store (WrapGlooStore): peers' heartbeats would look frozen too.
      report_ = absl::StrCat(" [peer check on rank ", rank_, " unavailable: this rank's heartbeat cannot be written: ",
                             own_error, "]");
      return report_;
    }
    const PeerHealth h = CheckPeers();
    auto ranks = [](const std::vector<int>& v) {
      return absl::StrCat(v.size() == 1 ? "rank " : "ranks ", absl::StrJoin(v, ", "));
    };
    std::vector<std::string> parts;
    if (!h.store_error.empty()) {
      parts.push_back(absl::StrCat("store unreachable (", h.store_error, ")"));
    } else {
      if (h.own_heartbeat_stalled) {
        parts.push_back(absl::StrCat("this rank's own heartbeat advanced only ", h.own_beats_in_window,
                                     " times (", kMinOwnBeats, " needed) in ", (kOwnBeatsCap * interval_).count(),
                                     " ms and no peer's advanced (an overloaded machine or a stalled store), so a "
                                     "peer's silent heartbeat is no evidence against it"));
      }
      if (!h.silent.empty()) {
        parts.push_back(absl::StrCat(ranks(h.silent), h.silent.size() == 1 ? " is" : " are",
                                     " not responding (no heartbeat for ", (3 * interval_).count(),
                                     " ms or more, while other heartbeats kept going: killed, stopped or hung)"));
      }
      if (!h.down.empty()) {
        parts.push_back(absl::StrCat(ranks(h.down), h.down.size() == 1 ? " has shut down its communicator" : " have shut down their communicators"));
      }
      if (parts.empty()) parts.push_back("every peer's heartbeat is advancing (peers alive; a slow peer or ranks out of step?)");
    }
    report_ = absl::StrCat(" [peer check on rank ", rank_, ": ", absl::StrJoin(parts, "; "), "]");
    return report_;
  }

  // Appends the peer check to a timeout or transport error (same exception type).
  std::exception_ptr Annotate(std::exception_ptr error) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return error;  // failing because this rank shut down, not because of a peer
    }
    try {
      std::rethrow_exception(error);
    } catch (const AbortedError&) {
      return error;
    } catch (const TimeoutError& e) {
      return std::make_exception_ptr(TimeoutError(e.what() + PeerReport()));
    } catch (const PeerError& e) {
      return std::make_exception_ptr(PeerError(e.what() + PeerReport()));
    } catch (const CommError& e) {
      return std::make_exception_ptr(CommError(e.what() + PeerReport()));
    } catch (...) {
      return error;
    }
  }

  std::vector<int> UnresponsivePeers() {
    PeerHealth h = CheckPeers();
    std::vector<int> out = h.silent;
    out.insert(out.end(), h.down.begin(), h.down.end());
    std::sort(out.begin(), out.end());
    return out;
  }

  void Poison(std::exception_ptr error) {
    absl::MutexLock lock(&mu_);
    if (first_failure_) return;
    first_failure_ = error;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      failure_text_ = e.what();
    }
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

  void WorkerLoop(Lane& lane) {
    absl::MutexLock lock(&mu_);
    for (;;) {
      mu_.Await(absl::Condition(
          +[](Lane* l) ABSL_NO_THREAD_SAFETY_ANALYSIS { return l->impl->stopping_ || l->impl->Ready(*l); }, &lane));
      if (stopping_) return;
      RunFront(lane);
    }
  }

  // A gathered send: CPU pieces of the message's dtype whose counts add up to its count.
  void CheckGather(const char* name, const P2POp& op) const {
    if (op.kind != P2POp::Kind::kSend) {
      throw InvalidArgumentError(absl::StrCat(Where(name), ": only a send can gather its message from pieces"));
    }
    size_t total = 0;
    for (size_t i = 0; i < op.gather.size(); ++i) {
      const Buffer& piece = op.gather[i];
      const std::string what = absl::StrCat("gather piece ", i);
      CheckBuffer(name, what.c_str(), piece);
      if (piece.device.is_cuda()) {
        throw InvalidArgumentError(absl::StrCat(Where(name), ": ", what, " is on ", piece.device.ToString(),
                                                "; gathered sends take CPU memory only"));
      }
      if (piece.dtype != op.buffer.dtype) {
        throw InvalidArgumentError(absl::StrCat(Where(name), ": ", what, " is ", DTypeName(piece.dtype),
                                                " but the message is ", DTypeName(op.buffer.dtype)));
      }
      total += piece.count;
    }
    if (total != op.buffer.count || op.buffer.device.is_cuda()) {
      throw InvalidArgumentError(absl::StrCat(Where(name), ": the gather pieces hold ", total,
                                              " elements but the message is ", op.buffer.ToString()));
    }
  }

  // `any_source`: receives may name kAnySource (recv_any_source and p2p batches); plain
  // recv() keeps -1 an out-of-range peer.
  std::shared_ptr<Work> PostP2P(absl::Span<const P2POp> ops, bool any_source = true) {
    if (ops.empty()) {
      auto work = std::make_shared<CompletionWork>(Where("p2p (empty batch)"));
      work->Complete(nullptr);
      return work;
    }
    const bool cuda = ops[0].buffer.device.is_cuda();
    std::string description = absl::StrCat("p2p batch of ", ops.size(), " on rank ", rank_, " of ", size_);
    for (const P2POp& op : ops) {
      const char* name = op.kind == P2POp::Kind::kSend ? "send" : "recv";
      if (op.gather.empty()) {
        CheckBuffer(name, "buffer", op.buffer);
      } else {
        CheckGather(name, op);
      }
      if (any_source && op.peer == kAnySource && op.kind == P2POp::Kind::kRecv) {
        if (op.buffer.device.is_cuda()) {
          throw InvalidArgumentError(absl::StrCat(Where(name), ": receive from any source needs a CPU buffer (NCCL has none)"));
        }
        if (size_ == 1) throw InvalidArgumentError(absl::StrCat(Where(name), ": receive from any source with no other rank"));
      } else {
        CheckPeer(name, op.peer, "peer");
      }
      if (op.peer == rank_) {
        throw InvalidArgumentError(absl::StrCat(Where(name), ": peer ", op.peer, " is this rank itself"));
      }
      if (op.buffer.device.is_cuda() != cuda) {
        throw InvalidArgumentError(absl::StrCat(Where(name), ": a p2p batch mixes CPU and CUDA buffers"));
      }
      if (cuda && op.progress) {
        throw InvalidArgumentError(absl::StrCat(Where(name), ": P2POp::progress is reported for CPU buffers only, not ",
                                                op.buffer.device.ToString()));
      }
      if (ops.size() == 1) {
        description = absl::StrCat(name, " ", op.buffer.ToString(), op.kind == P2POp::Kind::kSend ? " to" : " from",
                                   op.peer == kAnySource ? " any rank" : absl::StrCat(" rank ", op.peer), " (tag ",
                                   op.tag, ") on rank ", rank_, " of ", size_);
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) throw AbortedError(absl::StrCat(description, ": ", stop_reason_));
      if (first_failure_) {
        throw AbortedError(absl::StrCat(description, ": communicator unusable after an earlier failure: ",
                                        failure_text_));
      }
    }
    if (cuda) {
      if (!nccl_) {
        throw InvalidArgumentError(absl::StrCat(description,
                                                ": point-to-point on CUDA needs CommunicatorOptions::cuda_device set "
                                                "(GOSSIPCC_CUDA_DEVICE for the c10d backend) or a CUDA collective "
                                                "first: the NCCL communicator must be created collectively"));
      }
      absl::MutexLock launch_lock(&nccl_mu_);
      return nccl_->P2P(ops, description);
    }
    try {
      return p2p_->Post(ops, description);
    } catch (const AbortedError&) {
      throw;
    } catch (const CommError&) {
      // Posting to a peer whose connection is already closed fails here, synchronously: the
      // same failure as in a batch, so the same peer check and the same poisoning.
      std::exception_ptr annotated = Annotate(std::current_exception());
      Poison(annotated);
      std::rethrow_exception(annotated);
    }
  }

  void Shutdown(const std::string& reason) {
    std::vector<QueuedTask> dropped;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
      stop_reason_ = absl::StrCat("communicator shut down (", reason, ")");
      // Operations that never started fail now; the ones running finish (bounded by their timeout).
      for (auto& lane : lanes_) {
        for (auto& task : lane->queue) {
          in_flight_.erase(task.seq);
          dropped.push_back(std::move(task));
        }
        lane->queue.clear();
      }
      std::sort(dropped.begin(), dropped.end(),
                [](const QueuedTask& a, const QueuedTask& b) { return a.seq < b.seq; });
      first_failure_ = first_failure_ ? first_failure_
                                      : std::make_exception_ptr(AbortedError(stop_reason_));
      if (failure_text_.empty()) failure_text_ = stop_reason_;
    }
    for (auto& task : dropped) task.run();  // Run() sees first_failure_ and fails each with AbortedError
    StopHeartbeat();  // and says "down", so peers that fail next name this rank as shut down
    if (p2p_) p2p_->Shutdown(stop_reason_);
    for (auto& lane : lanes_) {
      if (lane->worker.joinable()) lane->worker.join();
    }
    {
      // Collectives running inline on waiting threads finish first (bounded by their timeout).
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Impl* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return std::none_of(self->lanes_.begin(), self->lanes_.end(),
                                [](const std::unique_ptr<Lane>& l) { return l->running; });
          },
          this));
    }
    // Buffers of failed operations may still be referenced by Gloo's pairs: free them only
    // once every pair is gone. p2p_ goes first: its destructor waits for batches still in
    // flight, which may fail and retire their buffers meanwhile. Destroying the contexts
    // would not do: each retired buffer holds its context (and so the pairs) alive.
    p2p_.reset();
    for (auto& lane : lanes_) {
      for (auto& b : lane->handshake->TakeRetiredBuffers()) {
        retired_buffers_.Add(std::move(b));
      }
    }
    std::vector<std::shared_ptr<void>> retired = retired_buffers_.TakeAll();
    nccl_.reset();
    for (const auto& mesh : meshes_) DestroyPairs(*mesh);
    meshes_.clear();
    for (auto& lane : lanes_) {
      lane->context.reset();
      lane->signature_context.reset();
    }
    context_.reset();
    retired.clear();
  }

  TrafficCounters traffic() const {
    absl::MutexLock lock(&mu_);
    TrafficCounters t = traffic_;
    if (p2p_) {
      t.p2p_bytes_sent = p2p_->bytes_sent();
      t.p2p_bytes_received = p2p_->bytes_received();
    }
    for (const auto& lane : lanes_) {
      t.packed_allreduce_raw_bytes += lane->scratch.packed_raw_bytes.load(std::memory_order_relaxed);
      t.packed_allreduce_wire_bytes += lane->scratch.packed_wire_bytes.load(std::memory_order_relaxed);
    }
    return t;
  }

  const std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const CommunicatorOptions options_;

  // Declared before everything that adds to it (see Shutdown).
  RetiredBuffers retired_buffers_;
  std::shared_ptr<gloo::Context> context_;
  // context_ and p2p_'s payload meshes, kept until Shutdown has destroyed their pairs.
  std::vector<std::shared_ptr<gloo::Context>> meshes_;
  std::unique_ptr<P2PExchange> p2p_;
  std::unique_ptr<NcclTransport> nccl_;
  absl::Mutex nccl_mu_;  // NCCL calls on one communicator must not interleave across threads

  mutable absl::Mutex mu_;
  // Created by Connect, then fixed; each lane's queue and running flag guarded by mu_.
  std::vector<std::unique_ptr<Lane>> lanes_;
  // Every collective queued or running, by sequence number: what it touches (WaitsForEarlier).
  std::map<uint64_t, Footprint> in_flight_ ABSL_GUARDED_BY(mu_);
  // Lets a Work's inline runner reach this Impl only while it is alive (see ~Impl).
  struct InlineGate {
    absl::Mutex mu;
    Impl* impl ABSL_GUARDED_BY(mu);
  };
  const std::shared_ptr<InlineGate> gate_ = MakeGate(this);
  static std::shared_ptr<InlineGate> MakeGate(Impl* impl) {
    auto gate = std::make_shared<InlineGate>();
    absl::MutexLock lock(&gate->mu);
    gate->impl = impl;
    return gate;
  }
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  std::exception_ptr first_failure_ ABSL_GUARDED_BY(mu_);
  std::string failure_text_ ABSL_GUARDED_BY(mu_);
  TrafficCounters traffic_ ABSL_GUARDED_BY(mu_);

  // Peer health (std::mutex: the heartbeat thread waits with a timeout).
  std::chrono::milliseconds interval_{0};
  std::shared_ptr<Store> health_store_;
  uint64_t beats_ = 0;  // heartbeat thread only (and Connect() before it starts)
  std::thread heartbeat_;
  std::mutex heartbeat_mu_;
  std::condition_variable heartbeat_cv_;  // stop requests, and every heartbeat written
  uint64_t beats_written_ = 0;            // guarded by heartbeat_mu_: heartbeats the store took
  bool heartbeat_stop_ = false;
  std::string heartbeat_error_;  // guarded by heartbeat_mu_: the last heartbeat's store error
  std::mutex report_mu_;
  bool report_done_ = false;
  std::string report_;
};

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
TrafficCounters Communicator::traffic() const { return impl_->traffic(); }
std::vector<int> Communicator::UnresponsivePeers() { return impl_->UnresponsivePeers(); }

namespace {
absl::Span<const uint8_t> BytesOf(const Buffer& b) {
  return absl::Span<const uint8_t>(static_cast<const uint8_t*>(b.data), b.bytes());
}

OpSpec Spec(OpKind kind, const Buffer& b, uint64_t count) {
  OpSpec s;
  s.kind = kind;
  s.dtype = b.dtype;
  s.device = b.device;
  s.count = count;
  return s;
}
}  // namespace

std::shared_ptr<Work> Communicator::allreduce(Buffer data, ReduceOp op) {
  impl_->CheckBuffer("allreduce", "data", data);
  try {
    CheckReduceSupported(data.dtype, op);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("allreduce"), ": ", e.what()));
  }
  OpSpec spec = Spec(OpKind::kAllreduce, data, data.count);
  spec.op = op;
  Impl::EagerPlan eager = impl_->Eager(data.device, data.bytes(), BytesOf(data),
                                       [this, data, op](const CollectiveHandshake& h, CollectiveScratch& scratch) {
                                         EagerAllreduce(h, size(), data, op, scratch.wide);
                                       });
  return impl_->Submit(
      spec, Impl::Footprint::Of({data}),
      [=](const GlooCall& call) {
        if (data.count) {
          GlooAllreduce(call, data, op);
        } else {
          RunCheck(call);
        }
      },
      [=](NcclTransport& n, std::string d) { return n.Allreduce(data, op, std::move(d)); }, data.bytes(),
      std::move(eager), /*checks_itself=*/true);
}

std::shared_ptr<Work> Communicator::broadcast(Buffer data, int root) {
  impl_->CheckBuffer("broadcast", "data", data);
  impl_->CheckPeer("broadcast", root, "root");
  OpSpec spec = Spec(OpKind::kBroadcast, data, data.count);
  spec.root = root;
  Impl::EagerPlan eager = impl_->Eager(
      data.device, data.bytes(), rank() == root ? BytesOf(data) : absl::Span<const uint8_t>(),
      [data, root, me = rank()](const CollectiveHandshake& h, CollectiveScratch&) { EagerBroadcast(h, me, data, root); });
  return impl_->Submit(
      spec, Impl::Footprint::Of({data}), [=](const GlooCall& call) { if (data.count && call.context->size > 1) GlooBroadcast(call, data, root); },
      [=](NcclTransport& n, std::string d) { return n.Broadcast(data, root, std::move(d)); }, data.bytes(),
      std::move(eager));
}

std::shared_ptr<Work> Communicator::allgather(Buffer input, Buffer output) {
  impl_->CheckBuffer("allgather", "input", input);
  impl_->CheckBuffer("allgather", "output", output);
  impl_->CheckSame("allgather", input, output);
  if (output.count != input.count * size()) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("allgather"), ": output has ", output.count,
                                            " elements but size() * input.count = ", size(), " * ", input.count,
                                            " = ", input.count * size(), " are required"));
  }
  Impl::EagerPlan eager =
      impl_->Eager(input.device, input.bytes(), BytesOf(input),
                   [output, counts = std::vector<size_t>(size(), input.count), n = size()](
                       const CollectiveHandshake& h, CollectiveScratch&) { EagerAllgatherv(h, n, output, counts); });
  return impl_->Submit(
      Spec(OpKind::kAllgather, input, input.count), Impl::Footprint::Of({input, output}),
      [=](const GlooCall& call) { if (input.count) GlooAllgather(call, input, output); },
      [=](NcclTransport& n, std::string d) { return n.Allgather(input, output, std::move(d)); }, input.bytes(),
      std::move(eager));
}

std::shared_ptr<Work> Communicator::allgatherv(Buffer input, Buffer output, std::vector<size_t> counts) {
  impl_->CheckBuffer("allgatherv", "input", input);
  impl_->CheckBuffer("allgatherv", "output", output);
  impl_->CheckSame("allgatherv", input, output);
  impl_->CheckCounts("allgatherv", "counts", counts);
  if (input.count != counts[rank()]) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("allgatherv"), ": input has ", input.count,
                                            " elements but counts[", rank(), "] = ", counts[rank()]));
  }
  const size_t total = Sum(counts);
  if (output.count != total) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("allgatherv"), ": output has ", output.count,
                                            " elements but the counts add up to ", total));
  }
  OpSpec spec = Spec(OpKind::kAllgatherv, input, total);
  spec.layout_hash = HashCounts(counts);
  // Decided from the counts vector, which every rank must pass alike (checked), not from this
  // rank's own count, so all ranks choose the same plan.
  Impl::EagerPlan eager = impl_->Eager(
      input.device, *std::max_element(counts.begin(), counts.end()) * ElementSize(input.dtype), BytesOf(input),
      [output, counts, n = size()](const CollectiveHandshake& h, CollectiveScratch&) { EagerAllgatherv(h, n, output, counts); });
  return impl_->Submit(
      spec, Impl::Footprint::Of({input, output}), [=](const GlooCall& call) { if (total) GlooAllgatherv(call, input, output, counts); },
      [=](NcclTransport& n, std::string d) { return n.Allgatherv(input, output, counts, std::move(d)); },
      input.bytes(), std::move(eager));
}

std::shared_ptr<Work> Communicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  impl_->CheckBuffer("reduce_scatter", "input", input);
  impl_->CheckBuffer("reduce_scatter", "output", output);
  impl_->CheckSame("reduce_scatter", input, output);
  try {
    CheckReduceSupported(input.dtype, op);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("reduce_scatter"), ": ", e.what()));
  }
  if (input.count != output.count * size()) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("reduce_scatter"), ": input has ", input.count,
                                            " elements but size() * output.count = ", size(), " * ", output.count,
                                            " = ", output.count * size(), " are required"));
  }
  OpSpec spec = Spec(OpKind::kReduceScatter, input, output.count);
  spec.op = op;
  Impl::EagerPlan eager = impl_->Eager(input.device, input.bytes(), BytesOf(input),
                                       [this, output, op](const CollectiveHandshake& h, CollectiveScratch& scratch) {
                                         EagerReduceScatter(h, size(), rank(), output, op, scratch.wide);
                                       });
  return impl_->Submit(
      spec, Impl::Footprint::Of({input, output}), [=](const GlooCall& call) { GlooReduceScatter(call, input, output, op); },
      [=](NcclTransport& n, std::string d) { return n.ReduceScatter(input, output, op, std::move(d)); },
      input.bytes(), std::move(eager));
}

std::shared_ptr<Work> Communicator::alltoall(Buffer input, Buffer output) {
  impl_->CheckBuffer("alltoall", "input", input);
  impl_->CheckBuffer("alltoall", "output", output);
  impl_->CheckSame("alltoall", input, output);
  if (input.count != output.count || input.count % size() != 0) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("alltoall"), ": input (", input.count, ") and output (",
                                            output.count, ") must have the same element count, a multiple of size() = ",
                                            size()));
  }
  const size_t chunk = input.count / size();
  std::vector<size_t> counts(size(), chunk);
  return impl_->Submit(
      Spec(OpKind::kAlltoall, input, input.count), Impl::Footprint::Of({input, output}),
      [=](const GlooCall& call) { if (input.count) GlooAlltoall(call, input, output); },
      [=](NcclTransport& n, std::string d) { return n.Alltoallv(input, counts, output, counts, std::move(d)); },
      input.bytes());
}

std::shared_ptr<Work> Communicator::alltoallv(Buffer input, std::vector<size_t> send_counts, Buffer output,
                                              std::vector<size_t> recv_counts) {
  impl_->CheckBuffer("alltoallv", "input", input);
  impl_->CheckBuffer("alltoallv", "output", output);
  impl_->CheckSame("alltoallv", input, output);
  impl_->CheckCounts("alltoallv", "send_counts", send_counts);
  impl_->CheckCounts("alltoallv", "recv_counts", recv_counts);
  if (Sum(send_counts) != input.count || Sum(recv_counts) != output.count) {
    throw InvalidArgumentError(absl::StrCat(impl_->Where("alltoallv"), ": send_counts add up to ", Sum(send_counts),
                                            " (input has ", input.count, "), recv_counts add up to ", Sum(recv_counts),
                                            " (output has ", output.count, ")"));
  }
  OpSpec spec = Spec(OpKind::kAlltoallv, input, 0);
  spec.send_counts = send_counts;
  spec.recv_counts = recv_counts;
  return impl_->Submit(
      spec, Impl::Footprint::Of({input, output}),
      [=](const GlooCall& call) {
        if (call.context->size == 1) {
          if (input.count) std::memcpy(output.data, input.data, input.bytes());
        } else {
          GlooAlltoallv(call, input, send_counts, output, recv_counts);
        }
      },
      [=](NcclTransport& n, std::string d) {
        return n.Alltoallv(input, send_counts, output, recv_counts, std::move(d));
      },
      input.bytes());
}

std::shared_ptr<Work> Communicator::barrier() {
  OpSpec spec;
  spec.kind = OpKind::kBarrier;
  // A CPU barrier is the handshake alone: a rank gets past it only once every peer's header
  // (sent on entering the barrier) has arrived.
  Impl::EagerPlan eager = impl_->Eager(spec.device, 0, {}, [](const CollectiveHandshake&, CollectiveScratch&) {});
  return impl_->Submit(
      spec, Impl::Footprint::Fence(), [](const GlooCall& call) { GlooBarrier(call); },
      [](NcclTransport& n, std::string d) { return n.Barrier(std::move(d)); }, 0, std::move(eager));
}

std::shared_ptr<Work> Communicator::send(Buffer data, int peer, uint32_t tag) {
  P2POp op = P2POp::Send(data, peer, tag);
  return impl_->PostP2P(absl::MakeConstSpan(&op, 1));
}

std::shared_ptr<Work> Communicator::recv(Buffer data, int peer, uint32_t tag) {
  P2POp op = P2POp::Recv(data, peer, tag);
  return impl_->PostP2P(absl::MakeConstSpan(&op, 1), /*any_source=*/false);
}

std::shared_ptr<Work> Communicator::recv_any_source(Buffer data, uint32_t tag, int* source) {
  P2POp op = P2POp::Recv(data, kAnySource, tag, source);
  return impl_->PostP2P(absl::MakeConstSpan(&op, 1));
}

std::shared_ptr<Work> Communicator::p2p(absl::Span<const P2POp> ops) { return impl_->PostP2P(ops); }

}  // namespace gossipcc
