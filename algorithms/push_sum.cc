#include "algorithms/push_sum.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "algorithms/gossip_message.h"
#include "comm/errors.h"

namespace gossipcc {

PushSum::PushSum(std::shared_ptr<const PeerGraph> graph, MixingFn mixing, uint32_t tag)
    : graph_(std::move(graph)), mixing_(std::move(mixing)), tag_(tag) {
  if (!graph_) throw InvalidArgumentError("push_sum: null peer graph");
}

void PushSum::Step(Communicator& comm, std::vector<Buffer> buffers) {
  if (graph_->world_size() != comm.size()) {
    throw InvalidArgumentError(absl::StrCat("push_sum: peer graph ", graph_->name(), " is for ",
                                            graph_->world_size(), " ranks but the communicator has ", comm.size()));
  }
  gossip_internal::CheckBuffers("push_sum", buffers);
  const int rank = comm.rank();
  gossip_internal::RoundSpec spec;
  spec.algorithm = "push_sum";
  spec.step = step_;
  spec.tag = tag_;
  spec.send_to = graph_->OutPeers(rank, step_);
  spec.recv_from = graph_->InPeers(rank, step_);
  if (mixing_) {
    std::vector<double> shares = mixing_(rank, step_, spec.send_to);
    if (shares.size() != spec.send_to.size() + 1) {
      throw InvalidArgumentError(absl::StrCat("push_sum: mixing returned ", shares.size(), " shares for ",
                                              spec.send_to.size(), " out-peers (expected self + one per peer)"));
    }
    double sum = 0;
    for (double s : shares) {
      if (!(s >= 0) || !std::isfinite(s)) {
        throw InvalidArgumentError(absl::StrCat("push_sum: mixing share ", s, " is not a finite value >= 0"));
      }
      sum += s;
    }
    if (std::abs(sum - 1.0) > 1e-12) {
      throw InvalidArgumentError(absl::StrCat("push_sum: mixing shares of rank ", rank, " at step ", step_,
                                              " sum to ", sum, ", not 1 (must be column-stochastic)"));
    }
    spec.self_coef = shares[0];
    spec.send_scale.assign(shares.begin() + 1, shares.end());
  } else {
    double share = 1.0 / static_cast<double>(spec.send_to.size() + 1);
    spec.self_coef = share;
    spec.send_scale.assign(spec.send_to.size(), share);
  }
  spec.recv_coef.assign(spec.recv_from.size(), 1.0);
  double w = weight_;
  spec.weight = &w;
  gossip_internal::RunRound(comm, buffers, spec);
  weight_ = w;
  ++step_;
}

void PushSum::Debias(const Buffer& in, Buffer out) const {
  gossip_internal::CheckBuffers("push_sum debias", {in, out});
  if (in.count != out.count) {
    throw InvalidArgumentError(absl::StrCat("push_sum debias: input has ", in.count, " elements, output ",
                                            out.count));
  }
  if (in.dtype == DType::kFloat64) {
    const double* a = static_cast<const double*>(in.data);
    double* b = static_cast<double*>(out.data);
    for (size_t e = 0; e < in.count; ++e) b[e] = a[e] / weight_;
  } else {
    const float* a = static_cast<const float*>(in.data);
    float* b = static_cast<float*>(out.data);
    for (size_t e = 0; e < in.count; ++e) b[e] = static_cast<float>(a[e] / weight_);
  }
}

void PushSum::Restore(int64_t step, double weight) {
  if (step < 0) throw InvalidArgumentError(absl::StrCat("push_sum: restore with negative step ", step));
  if (!(weight > 0) || !std::isfinite(weight)) {
    throw InvalidArgumentError(absl::StrCat("push_sum: restore with weight ", weight, " (must be finite and > 0)"));
  }
  step_ = step;
  weight_ = weight;
}

}  // namespace gossipcc
