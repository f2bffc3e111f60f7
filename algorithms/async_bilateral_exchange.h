// Bilateral exchange (AD-PSGD, Lian et al. 2018), asynchronous mode.
//
// Ranks are split into active (odd) and passive (even) halves. An active rank exchanges with
// one passive peer at a time, without any global step: it sends its x and waits for that
// peer's answer, then both set x <- (x + x_peer) / 2 (the passive rank answers with its x from
// before the exchange, so the pair ends bitwise equal and the sum over ranks is conserved).
// A passive rank answers requests in arrival order, from whichever active rank is ready first
// (a receive from any source), so no rank waits for a global round.
// Active rank a's peers are its bipartite-exponential neighbours (offsets +-1, +-(1+2^m),
// all of opposite parity), taken in turn by a's own exchange counter.
//
// Messages: a request is one int64 (the active rank's request number, or -1 for "done") on
// `tag`, followed by the active rank's x (all buffers packed) on `tag + 2`; the answer is the
// request number on `tag + 1` and the passive rank's x on `tag + 3`. The request goes ahead
// on its own so that the passive rank, once it knows who asks, sends its x while the active
// rank's is still arriving: the two copies cross at once and an exchange takes one message
// time, not two. The comm layer checks that the sizes agree. CPU buffers only (a
// receive from any source is a Gloo feature); float32/float64/float16/bfloat16.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "comm/types.h"

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
