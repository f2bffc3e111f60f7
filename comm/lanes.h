// Lanes: which collective runs when, and on which thread.
//
// Collective k (k counts every collective in issue order, from 0) runs on lane k % count, one
// at a time per lane, in issue order, so every rank puts the same collective on the same lane.
// The rule that keeps results those of issue order: a collective starts only after every
// earlier one on overlapping memory has completed (Footprint); a fence (barriers, CUDA
// collectives) overlaps everything. Collectives on disjoint memory (DDP's buckets) so overlap
// on the wire, one per lane.
//
// Who runs a collective: its lane's worker thread, or a thread blocked in an untimed wait() on
// it (InlineRunner) when the collective is next in its lane, free to start and not yet started.
// A caller that waits at once (the common case) so skips two thread hand-offs, which on a
// loaded machine cost more than a small message's trip across the network.
//
// Knows nothing of meshes or data: a task is a closure, which the Communicator builds.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "comm/core/types.h"

namespace gossipcc {

// The memory a collective touches (its buffers' byte ranges, all taken as written), or a
// fence, which conflicts with every collective.
struct Footprint {
  bool fence = false;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // [begin, end), non-empty

  static Footprint Fence() { return Footprint{true, {}}; }
  static Footprint Of(std::initializer_list<Buffer> buffers);
  bool Conflicts(const Footprint& other) const;
};

class Lanes {
 public:
  using Task = std::function<void()>;

  // `count` lanes, their workers not started yet (StartWorkers).
  explicit Lanes(int count);
  // Stops and joins (Stop, Join) if the owner has not.
  ~Lanes();
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  int count() const { return static_cast<int>(lanes_.size()); }
  int LaneOf(uint64_t seq) const { return static_cast<int>(seq % lanes_.size()); }

  void StartWorkers();

  // Takes the next sequence number `seq` and queues make(seq) on lane LaneOf(seq), in flight
  // with `footprint` until the task returns. `make` runs under the scheduler's lock, so that
  // sequence numbers and each lane's queue order agree. Returns false, queueing nothing, after
  // Stop.
  bool Enqueue(Footprint footprint, const std::function<Task(uint64_t seq)>& make);

  // For CompletionWork::SetInlineRunner: runs collective `seq` on the calling thread if it is
  // next in its lane and may start; otherwise leaves it to the worker. Does nothing once these
  // lanes are stopped, or gone (CloseInlineRuns).
  std::function<void()> InlineRunner(uint64_t seq);
  // Waits for inline runs in progress and makes every later one a no-op: call it first thing
  // when the owner is destroyed, since a Work (and its inline runner) may outlive the owner.
  void CloseInlineRuns();

  // Refuses further Enqueue and returns the tasks that never started, in issue order (no
  // longer in flight; the caller runs or drops them). Workers stop after their current task.
  // Idempotent (later calls return nothing).
  std::vector<Task> Stop();
  // After Stop: joins the workers and waits for collectives running inline on waiting threads
  // (each bounded by its timeout).
  void Join();

 private:
  struct Queued {
    uint64_t seq;
    Task run;
  };
  struct Lane {
    explicit Lane(Lanes* owner) : lanes(owner) {}
    Lanes* const lanes;  // for the worker's wait condition
    std::deque<Queued> queue;  // guarded by mu_
    bool running = false;      // guarded by mu_: a collective runs (worker or inline)
    std::thread worker;
  };
  // Lets an inline runner reach these lanes only while they are alive.
  struct Gate {
    absl::Mutex mu;
    Lanes* lanes ABSL_GUARDED_BY(mu);
  };
  static std::shared_ptr<Gate> OpenGate(Lanes* lanes);

  bool WaitsForEarlier(uint64_t seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Ready(const Lane& lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TryRunInline(uint64_t seq);
  void RunFront(Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop(Lane& lane);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // fixed at construction
  // Every collective queued or running, by sequence number: what it touches.
  std::map<uint64_t, Footprint> in_flight_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  const std::shared_ptr<Gate> gate_;
};

}  // namespace gossipcc
