// Bilateral exchange (AD-PSGD, Lian et al. 2018), asynchronous (docs/gossip.md): odd ranks are
// active, even ranks passive. An active rank exchanges with its bipartite-exponential passive
// neighbours in turn, each answering whichever active rank asks first; both set
// x <- (x + x_peer) / 2, ending bitwise equal with the sum conserved. The request number travels
// ahead of x, so the two copies cross and an exchange costs one message time. CPU float buffers.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "comm/core/types.h"

namespace gossipcc {

class AsyncBilateralExchange {
 public:
  static constexpr uint32_t kDefaultTag = 0x41424c00;  // "ABL"; +1, +2, +3: see above

  explicit AsyncBilateralExchange(uint32_t tag = kDefaultTag);

  static bool IsActive(int rank) { return rank % 2 == 1; }
  // The passive peers active rank `rank` cycles through (ascending), for `world_size` ranks.
  static std::vector<int> PassivePeers(int rank, int world_size);

  // Active ranks: one exchange with the next passive peer in turn; returns that peer.
  int Exchange(Communicator& comm, std::vector<Buffer> buffers);
  // Active ranks, once at the end: tells every passive peer it will send no more requests.
  void Finish(Communicator& comm, std::vector<Buffer> buffers);

  // Passive ranks: answers requests as they arrive until `max_requests` exchanges were
  // answered (-1: no limit) or every active peer has finished. Returns the exchanges answered.
  int Serve(Communicator& comm, std::vector<Buffer> buffers, int max_requests = -1);
  // Passive ranks: true once every active peer has finished.
  bool all_active_finished(const Communicator& comm) const;

  int64_t exchanges() const { return exchanges_; }
  void Restore(int64_t exchanges);

 private:
  uint32_t tag_;
  std::vector<uint64_t> outgoing_;  // x packed, when it spans several buffers
  std::vector<uint64_t> incoming_;  // the peer's x
  int64_t exchanges_ = 0;  // active: requests sent; passive: requests answered
  int finished_peers_ = 0;
  bool finished_ = false;
};

}  // namespace gossipcc
