#include "algorithms/symmetric_gossip.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "algorithms/elementwise.h"
#include "algorithms/gossip_round.h"
#include "comm/core/errors.h"

namespace gossipcc {

SymmetricGossip::SymmetricGossip(std::shared_ptr<const PeerGraph> graph, uint32_t tag)
    : graph_(std::move(graph)), tag_(tag) {
  pool_ = std::make_shared<gossip_internal::MessagePool>();
  if (!graph_) throw InvalidArgumentError("symmetric_gossip: null peer graph");
}

std::vector<double> SymmetricGossip::Weights(int rank, int64_t step) const {
  std::vector<int> nbrs = graph_->OutPeers(rank, step);
  std::vector<double> w(nbrs.size() + 1);
  double sum = 0;
  for (size_t j = 0; j < nbrs.size(); ++j) {
    size_t dj = graph_->OutPeers(nbrs[j], step).size();
    w[j + 1] = 1.0 / (1.0 + static_cast<double>(std::max(nbrs.size(), dj)));
    sum += w[j + 1];
  }
  w[0] = 1.0 - sum;
  return w;
}

void SymmetricGossip::Step(Communicator& comm, std::vector<Buffer> buffers) {
  if (graph_->world_size() != comm.size()) {
    throw InvalidArgumentError(absl::StrCat("symmetric_gossip: peer graph ", graph_->name(), " is for ",
                                            graph_->world_size(), " ranks but the communicator has ", comm.size()));
  }
  gossip_internal::CheckBuffers("symmetric_gossip", buffers);
  if (!graph_->IsSymmetricAt(step_)) {
    throw InvalidArgumentError(absl::StrCat("symmetric_gossip: peer graph ", graph_->name(),
                                            " is not symmetric at step ", step_,
                                            " (D-PSGD needs an undirected graph, e.g. ring or hypercube)"));
  }
  const int rank = comm.rank();
  std::vector<double> w = Weights(rank, step_);
  gossip_internal::RoundSpec spec;
  spec.algorithm = "symmetric_gossip";
  spec.step = step_;
  spec.tag = tag_;
  spec.pool = pool_;
  spec.send_in_place = true;  // synchronous: finished right below
  spec.send_to = graph_->OutPeers(rank, step_);
  spec.send_scale.assign(spec.send_to.size(), 1.0);
  spec.recv_from = spec.send_to;  // symmetric: in-peers == out-peers
  auto round = gossip_internal::StartRound(comm, buffers, std::move(spec));
  gossip_internal::FinishRound(*round, buffers, w[0], std::vector<double>(w.begin() + 1, w.end()), nullptr);
  ++step_;
}

void SymmetricGossip::Restore(int64_t step) {
  if (step < 0) throw InvalidArgumentError(absl::StrCat("symmetric_gossip: restore with negative step ", step));
  step_ = step;
}

}  // namespace gossipcc
