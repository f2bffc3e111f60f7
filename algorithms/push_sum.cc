#include "algorithms/push_sum.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "algorithms/elementwise.h"
#include "algorithms/gossip_round.h"
#include "comm/core/errors.h"

namespace gossipcc {

MixingFn KeepShareMixing(double keep) {
  if (!(keep > 0 && keep <= 1)) {
    throw InvalidArgumentError(absl::StrCat("push_sum mixing: keep share ", keep, " must be in (0, 1]"));
  }
  return [keep](int, int64_t, const std::vector<int>& out) {
    std::vector<double> shares(out.size() + 1);
    shares[0] = out.empty() ? 1.0 : keep;
    for (size_t j = 0; j < out.size(); ++j) shares[j + 1] = (1.0 - keep) / static_cast<double>(out.size());
    return shares;
  };
}

PushSumPlan MakePushSumPlan(const PeerGraph& graph, const MixingFn& mixing, int rank, int64_t step,
                            const std::string& algorithm) {
  PushSumPlan plan;
  plan.out_peers = graph.OutPeers(rank, step);
  plan.in_peers = graph.InPeers(rank, step);
  if (!mixing) {
    const double share = 1.0 / static_cast<double>(plan.out_peers.size() + 1);
    plan.keep = share;
    plan.send_shares.assign(plan.out_peers.size(), share);
    return plan;
  }
  std::vector<double> shares = mixing(rank, step, plan.out_peers);
  if (shares.size() != plan.out_peers.size() + 1) {
    throw InvalidArgumentError(absl::StrCat(algorithm, ": mixing for rank ", rank, " at step ", step, " returned ",
                                            shares.size(), " shares for ", plan.out_peers.size(),
                                            " out-peers {", absl::StrJoin(plan.out_peers, ","),
                                            "} (expected the kept share + one per out-peer)"));
  }
  double sum = 0;
  for (size_t j = 0; j < shares.size(); ++j) {
    const double s = shares[j];
    if (!std::isfinite(s) || s < 0) {
      throw InvalidArgumentError(absl::StrCat(algorithm, ": mixing share ", j, " of rank ", rank, " at step ",
                                              step, " is ", s, " (must be finite and >= 0)"));
    }
    sum += s;
  }
  if (std::abs(sum - 1.0) > 1e-12) {
    throw InvalidArgumentError(absl::StrCat(algorithm, ": mixing shares of rank ", rank, " at step ", step,
                                            " sum to ", sum, ", not 1 (the mixing must be column-stochastic)"));
  }
  plan.keep = shares[0];
  plan.send_shares.assign(shares.begin() + 1, shares.end());
  return plan;
}

PushSum::PushSum(std::shared_ptr<const PeerGraph> graph, MixingFn mixing, uint32_t tag)
    : graph_(std::move(graph)), mixing_(std::move(mixing)), tag_(tag) {
  pool_ = std::make_shared<gossip_internal::MessagePool>();
  if (!graph_) throw InvalidArgumentError("push_sum: null peer graph");
}

namespace gossip_internal {

std::unique_ptr<PendingRound> StartPushSumRound(const std::string& algorithm, Communicator& comm,
                                                const PeerGraph& graph, const MixingFn& mixing, int64_t step,
                                                uint32_t tag, std::shared_ptr<MessagePool> pool, double weight,
                                                const std::vector<Buffer>& buffers, bool send_in_place,
                                                PushSumPlan* plan) {
  if (graph.world_size() != comm.size()) {
    throw InvalidArgumentError(absl::StrCat(algorithm, ": peer graph ", graph.name(), " is for ", graph.world_size(),
                                            " ranks but the communicator has ", comm.size()));
  }
  CheckBuffers(algorithm, buffers);
  *plan = MakePushSumPlan(graph, mixing, comm.rank(), step, algorithm);
  RoundSpec spec;
  spec.algorithm = algorithm;
  spec.step = step;
  spec.tag = tag;
  spec.pool = std::move(pool);
  spec.send_to = plan->out_peers;
  spec.send_scale = plan->send_shares;
  spec.recv_from = plan->in_peers;
  spec.with_weight = true;
  spec.weight = weight;
  spec.send_in_place = send_in_place;
  return StartRound(comm, buffers, std::move(spec));
}

}  // namespace gossip_internal

void PushSum::Step(Communicator& comm, std::vector<Buffer> buffers) {
  PushSumPlan plan;
  // Synchronous: the buffers stay as they are until the round is finished, so they are sent
  // from their own memory.
  auto round = gossip_internal::StartPushSumRound("push_sum", comm, *graph_, mixing_, step_, tag_, pool_, weight_,
                                                  buffers, /*send_in_place=*/true, &plan);
  double w = weight_;
  gossip_internal::FinishRound(*round, buffers, plan.keep, std::vector<double>(plan.in_peers.size(), 1.0), &w);
  weight_ = w;
  ++step_;
}

void PushSum::Debias(const Buffer& in, Buffer out) const { DebiasBuffer("push_sum debias", weight_, in, out); }

void DebiasBuffer(const std::string& algorithm, double weight, const Buffer& in, Buffer out) {
  gossip_internal::CheckBuffers(algorithm, {in, out});
  if (in.count != out.count) {
    throw InvalidArgumentError(absl::StrCat(algorithm, ": input has ", in.count, " elements, output ", out.count));
  }
  gossip_internal::HostStaging src(algorithm, {in});
  gossip_internal::HostStaging dst(algorithm, {out}, /*load=*/false);
  gossip_internal::DispatchFloating(in.dtype, [&](auto e) {
    using E = decltype(e);
    using S = typename E::Storage;
    using C = typename E::Compute;
    const S* a = static_cast<const S*>(src.host()[0].data);
    S* b = static_cast<S*>(dst.host()[0].data);
    const C w = static_cast<C>(weight);
    for (size_t i = 0; i < in.count; ++i) b[i] = E::Store(E::Load(a[i]) / w);
  });
  dst.WriteBack();
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
