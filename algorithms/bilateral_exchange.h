// Bilateral exchange (AD-PSGD, Lian et al. 2018), synchronous mode: at each step the ranks
// form a matching derived from the step number alone (identical on every rank), and each
// pair swaps values and sets x <- (x + x_peer) / 2. Pair averaging conserves the sum (up to
// one rounding per element) and both partners end bitwise equal.
//
// Default matching: the round-robin ("circle") tournament, n-1 rounds for even n, each a
// perfect matching, every pair meeting once per cycle; for odd n a virtual rank is added and
// whoever is paired with it idles that step. Alternatively any PeerGraph whose every step is
// a matching (each rank at most one peer, symmetric), e.g. "hypercube".
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/peer_graph.h"
#include "comm/communicator.h"
#include "comm/core/types.h"

namespace gossipcc {

namespace gossip_internal {
class MessagePool;
}

class BilateralExchange {
 public:
  static constexpr uint32_t kDefaultTag = 0x42494c00;  // "BIL"

  enum class Matching {
    kRoundRobin,            // circle tournament: every pair meets once per n-1 steps
    kBipartiteExponential,  // active (odd) ranks with passive (even) ones, see BipartitePartner
  };

  // Built-in matching (default: round robin).
  explicit BilateralExchange(uint32_t tag = kDefaultTag);
  explicit BilateralExchange(Matching matching, uint32_t tag = kDefaultTag);
  // Matching from `graph` (validated at each Step: InvalidArgumentError if not a matching).
  explicit BilateralExchange(std::shared_ptr<const PeerGraph> graph, uint32_t tag = kDefaultTag);

  // Round-robin partner of `rank` at `step` among `world_size` ranks, or -1 if it idles.
  static int RoundRobinPartner(int rank, int64_t step, int world_size);
  // AD-PSGD's bipartite matching: at step k an odd offset o_k cycles through +1, -1, +(1+2^m),
  // -(1+2^m) (1+2^m < n, distinct mod n); even rank i pairs with i + o_k, odd rank j with j - o_k.
  // A perfect matching between the passive (even) and active (odd) halves; n must be even
  // (InvalidArgumentError otherwise; n == 1 idles).
  static int BipartitePartner(int rank, int64_t step, int world_size);
  // This exchange's partner of `rank` at `step` (-1: idle).
  int Partner(int rank, int64_t step, int world_size) const;

  // One exchange at step(), in place (float32/float64/float16/bfloat16 buffers, one dtype and device, one fused
  // message each way); then step() advances. Errors as PushSum::Step.
  void Step(Communicator& comm, std::vector<Buffer> buffers);

  int64_t step() const { return step_; }
  void Restore(int64_t step);

 private:
  std::shared_ptr<const PeerGraph> graph_;  // null: the built-in matching
  Matching matching_ = Matching::kRoundRobin;
  uint32_t tag_;
  int64_t step_ = 0;
  std::shared_ptr<gossip_internal::MessagePool> pool_;
};

}  // namespace gossipcc
