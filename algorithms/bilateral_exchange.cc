#include "algorithms/bilateral_exchange.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "algorithms/elementwise.h"
#include "algorithms/gossip_round.h"
#include "comm/core/errors.h"

namespace gossipcc {

BilateralExchange::BilateralExchange(uint32_t tag) : tag_(tag) {
  pool_ = std::make_shared<gossip_internal::MessagePool>();
}

BilateralExchange::BilateralExchange(Matching matching, uint32_t tag) : matching_(matching), tag_(tag) {
  pool_ = std::make_shared<gossip_internal::MessagePool>();
}

int BilateralExchange::BipartitePartner(int rank, int64_t step, int n) {
  if (n < 1 || rank < 0 || rank >= n || step < 0) {
    throw InvalidArgumentError(absl::StrCat("bilateral_exchange: bad rank ", rank, " / world size ", n,
                                            " / step ", step));
  }
  if (n == 1) return -1;
  if (n % 2 != 0) {
    throw InvalidArgumentError(absl::StrCat("bilateral_exchange: the bipartite matching needs an even world size, got ",
                                            n, " (use the round-robin matching)"));
  }
  std::vector<int64_t> offsets;
  auto add = [&](int64_t o) {
    const int64_t m = ((o % n) + n) % n;
    if (std::find(offsets.begin(), offsets.end(), m) == offsets.end()) offsets.push_back(m);
  };
  add(1);
  add(-1);
  for (int64_t pw = 2; 1 + pw < n; pw *= 2) {
    add(1 + pw);
    add(-(1 + pw));
  }
  const int64_t o = offsets[static_cast<size_t>(step % static_cast<int64_t>(offsets.size()))];
  return static_cast<int>(rank % 2 == 0 ? (rank + o) % n : ((rank - o) % n + n) % n);
}

BilateralExchange::BilateralExchange(std::shared_ptr<const PeerGraph> graph, uint32_t tag)
    : graph_(std::move(graph)), tag_(tag) {
  pool_ = std::make_shared<gossip_internal::MessagePool>();
  if (!graph_) throw InvalidArgumentError("bilateral_exchange: null peer graph");
}

int BilateralExchange::RoundRobinPartner(int rank, int64_t step, int n) {
  if (n < 1 || rank < 0 || rank >= n || step < 0) {
    throw InvalidArgumentError(absl::StrCat("bilateral_exchange: bad rank ", rank, " / world size ", n,
                                            " / step ", step));
  }
  if (n == 1) return -1;
  const int m = n % 2 == 0 ? n : n + 1;  // players; rank m-1 may be virtual (odd n)
  const int r = static_cast<int>(step % (m - 1));
  int partner;
  if (rank == m - 1) {
    partner = r;
  } else if (rank == r) {
    partner = m - 1;
  } else {
    // Pairs (r+d, r-d) mod (m-1).
    partner = ((2 * r - rank) % (m - 1) + (m - 1)) % (m - 1);
  }
  return partner >= n ? -1 : partner;
}

int BilateralExchange::Partner(int rank, int64_t step, int n) const {
  if (!graph_) {
    return matching_ == Matching::kRoundRobin ? RoundRobinPartner(rank, step, n) : BipartitePartner(rank, step, n);
  }
  std::vector<int> out = graph_->OutPeers(rank, step);
  if (out.empty()) return -1;
  return out[0];
}

void BilateralExchange::Step(Communicator& comm, std::vector<Buffer> buffers) {
  const int n = comm.size(), rank = comm.rank();
  if (graph_) {
    if (graph_->world_size() != n) {
      throw InvalidArgumentError(absl::StrCat("bilateral_exchange: peer graph ", graph_->name(), " is for ",
                                              graph_->world_size(), " ranks but the communicator has ", n));
    }
    for (int i = 0; i < n; ++i) {
      std::vector<int> out = graph_->OutPeers(i, step_);
      if (out.size() > 1 || (out.size() == 1 && graph_->OutPeers(out[0], step_) != std::vector<int>{i})) {
        throw InvalidArgumentError(absl::StrCat("bilateral_exchange: peer graph ", graph_->name(),
                                                " is not a matching at step ", step_, " (rank ", i, " has ",
                                                out.size(), " out-peers or an unreciprocated edge)"));
      }
    }
  }
  gossip_internal::CheckBuffers("bilateral_exchange", buffers);
  int partner = Partner(rank, step_, n);
  gossip_internal::RoundSpec spec;
  spec.algorithm = "bilateral_exchange";
  spec.step = step_;
  spec.tag = tag_;
  spec.pool = pool_;
  spec.send_in_place = true;  // synchronous: finished right below
  if (partner >= 0) {
    spec.send_to = {partner};
    spec.send_scale = {1.0};
    spec.recv_from = {partner};
    auto round = gossip_internal::StartRound(comm, buffers, std::move(spec));
    gossip_internal::FinishRound(*round, buffers, 0.5, {0.5}, nullptr);
  }
  ++step_;
}

void BilateralExchange::Restore(int64_t step) {
  if (step < 0) throw InvalidArgumentError(absl::StrCat("bilateral_exchange: restore with negative step ", step));
  step_ = step;
}

}  // namespace gossipcc
