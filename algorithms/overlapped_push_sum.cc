#include "algorithms/overlapped_push_sum.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "algorithms/elementwise.h"
#include "algorithms/gossip_round.h"
#include "comm/core/errors.h"

namespace gossipcc {

OverlappedPushSum::OverlappedPushSum(std::shared_ptr<const PeerGraph> graph, int tau, MixingFn mixing, uint32_t tag)
    : graph_(std::move(graph)), tau_(tau), mixing_(std::move(mixing)), tag_(tag) {
  pool_ = std::make_shared<gossip_internal::MessagePool>();
  if (!graph_) throw InvalidArgumentError("overlapped_push_sum: null peer graph");
  if (tau < 0) throw InvalidArgumentError(absl::StrCat("overlapped_push_sum: tau must be >= 0, got ", tau));
}

OverlappedPushSum::~OverlappedPushSum() = default;  // PendingRound's destructor waits

void OverlappedPushSum::StartRound(Communicator& comm, std::vector<Buffer> buffers) {
  if (pending_) {
    throw InvalidArgumentError(absl::StrCat("overlapped_push_sum: rank ", comm.rank(), " starts round ", rounds_,
                                            " while round ", rounds_ - 1,
                                            " is still in flight (at most one per tensor; fold it first)"));
  }
  PushSumPlan plan;
  pending_ = gossip_internal::StartPushSumRound("overlapped_push_sum", comm, *graph_, mixing_, rounds_, tag_, pool_,
                                                weight_, buffers, /*send_in_place=*/false, &plan);
  // The messages hold a copy: keep our share locally right away.
  gossip_internal::ScaleBuffers("overlapped_push_sum", buffers, plan.keep);
  weight_ *= plan.keep;
  round_started_at_ = step_;
  ++rounds_;
}

void OverlappedPushSum::FinishRound(std::vector<Buffer> buffers) {
  if (!pending_) throw InvalidArgumentError("overlapped_push_sum: no round in flight to finish");
  const DType dtype = gossip_internal::CheckBuffers("overlapped_push_sum", buffers);
  const size_t total = gossip_internal::TotalCount(buffers);
  if (total != pending_->payload() || (!buffers.empty() && dtype != pending_->dtype())) {
    throw InvalidArgumentError(absl::StrCat("overlapped_push_sum: round ", pending_->spec().step, " was started on ",
                                            pending_->payload(), " x ", DTypeName(pending_->dtype()),
                                            " but is finished on ", total, " x ", DTypeName(dtype),
                                            " (still in flight)"));
  }
  std::unique_ptr<gossip_internal::PendingRound> round = std::move(pending_);
  round_started_at_ = -1;
  double w = weight_;
  gossip_internal::FinishRound(*round, buffers, 1.0, std::vector<double>(round->spec().recv_from.size(), 1.0), &w);
  weight_ = w;
}

void OverlappedPushSum::Flush(std::vector<Buffer> buffers) {
  if (pending_) FinishRound(std::move(buffers));
}

bool OverlappedPushSum::RoundArrived() const { return pending_ && pending_->is_completed(); }

void OverlappedPushSum::Step(Communicator& comm, std::vector<Buffer> buffers) {
  if (pending_ && step_ - round_started_at_ >= tau_) FinishRound(buffers);
  if (!pending_) {
    StartRound(comm, buffers);
    if (tau_ == 0) FinishRound(buffers);
  }
  ++step_;
}

void OverlappedPushSum::Debias(const Buffer& in, Buffer out) const {
  DebiasBuffer("overlapped_push_sum debias", weight_, in, out);
}

OverlappedPushSum::State OverlappedPushSum::state() const {
  return State{step_, rounds_, weight_, pending_ != nullptr, round_started_at_};
}

void OverlappedPushSum::Restore(const State& s) {
  if (pending_) {
    throw InvalidArgumentError("overlapped_push_sum: restore while a round is in flight (Flush first)");
  }
  if (s.in_flight) {
    throw InvalidArgumentError(absl::StrCat("overlapped_push_sum: cannot restore a state with a round in flight "
                                            "(started at step ", s.round_started_at, "); Flush() before saving"));
  }
  if (s.step < 0 || s.rounds < 0) {
    throw InvalidArgumentError(absl::StrCat("overlapped_push_sum: restore with negative step ", s.step,
                                            " or rounds ", s.rounds));
  }
  if (!(s.weight > 0) || !std::isfinite(s.weight)) {
    throw InvalidArgumentError(absl::StrCat("overlapped_push_sum: restore with weight ", s.weight,
                                            " (must be finite and > 0)"));
  }
  step_ = s.step;
  rounds_ = s.rounds;
  weight_ = s.weight;
  round_started_at_ = -1;
}

}  // namespace gossipcc
