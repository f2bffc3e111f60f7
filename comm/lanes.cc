#include "comm/lanes.h"

#include <algorithm>

namespace gossipcc {

Footprint Footprint::Of(std::initializer_list<Buffer> buffers) {
  Footprint f;
  for (const Buffer& b : buffers) {
    if (b.bytes() == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(b.data);
    f.ranges.emplace_back(begin, begin + b.bytes());
  }
  return f;
}

bool Footprint::Conflicts(const Footprint& other) const {
  if (fence || other.fence) return true;
  for (const auto& [b1, e1] : ranges) {
    for (const auto& [b2, e2] : other.ranges) {
      if (b1 < e2 && b2 < e1) return true;
    }
  }
  return false;
}

std::shared_ptr<Lanes::Gate> Lanes::OpenGate(Lanes* lanes) {
  auto gate = std::make_shared<Gate>();
  absl::MutexLock lock(&gate->mu);
  gate->lanes = lanes;
  return gate;
}

Lanes::Lanes(int count) : gate_(OpenGate(this)) {
  for (int i = 0; i < count; ++i) lanes_.push_back(std::make_unique<Lane>(this));
}

Lanes::~Lanes() {
  CloseInlineRuns();
  Stop();
  Join();
}

void Lanes::StartWorkers() {
  for (auto& lane : lanes_) lane->worker = std::thread([this, l = lane.get()] { WorkerLoop(*l); });
}

bool Lanes::Enqueue(Footprint footprint, const std::function<Task(uint64_t seq)>& make) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  const uint64_t seq = next_seq_++;
  in_flight_.emplace(seq, std::move(footprint));
  lanes_[LaneOf(seq)]->queue.push_back({seq, make(seq)});
  return true;
}

std::function<void()> Lanes::InlineRunner(uint64_t seq) {
  return [gate = gate_, seq] {
    absl::ReaderMutexLock lock(&gate->mu);
    if (gate->lanes) gate->lanes->TryRunInline(seq);
  };
}

void Lanes::CloseInlineRuns() {
  // Waits for waiters running an operation inline (they hold the gate shared).
  absl::MutexLock lock(&gate_->mu);
  gate_->lanes = nullptr;
}

bool Lanes::WaitsForEarlier(uint64_t seq) const {
  const Footprint& mine = in_flight_.at(seq);
  for (const auto& [earlier, footprint] : in_flight_) {
    if (earlier >= seq) break;
    if (mine.Conflicts(footprint)) return true;
  }
  return false;
}

bool Lanes::Ready(const Lane& lane) const {
  return !lane.running && !lane.queue.empty() && !WaitsForEarlier(lane.queue.front().seq);
}

void Lanes::TryRunInline(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  Lane& lane = *lanes_[LaneOf(seq)];
  if (lane.running || lane.queue.empty() || lane.queue.front().seq != seq || WaitsForEarlier(seq)) return;
  RunFront(lane);
}

// Takes the task at the lane's front and runs it with mu_ released; the lane stays busy until
// it returns, and the collective counts as in flight until then.
void Lanes::RunFront(Lane& lane) {
  Queued task = std::move(lane.queue.front());
  lane.queue.pop_front();
  lane.running = true;
  mu_.Unlock();
  task.run();
  mu_.Lock();
  lane.running = false;
  in_flight_.erase(task.seq);
}

void Lanes::WorkerLoop(Lane& lane) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.Await(absl::Condition(
        +[](Lane* l) ABSL_NO_THREAD_SAFETY_ANALYSIS { return l->lanes->stopping_ || l->lanes->Ready(*l); }, &lane));
    if (stopping_) return;
    RunFront(lane);
  }
}

std::vector<Lanes::Task> Lanes::Stop() {
  std::vector<Queued> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& lane : lanes_) {
      for (auto& task : lane->queue) {
        in_flight_.erase(task.seq);
        dropped.push_back(std::move(task));
      }
      lane->queue.clear();
    }
  }
  std::sort(dropped.begin(), dropped.end(), [](const Queued& a, const Queued& b) { return a.seq < b.seq; });
  std::vector<Task> tasks;
  for (auto& d : dropped) tasks.push_back(std::move(d.run));
  return tasks;
}

void Lanes::Join() {
  for (auto& lane : lanes_) {
    if (lane->worker.joinable()) lane->worker.join();
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](Lanes* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return std::none_of(self->lanes_.begin(), self->lanes_.end(),
                            [](const std::unique_ptr<Lane>& l) { return l->running; });
      },
      this));
}

}  // namespace gossipcc
