// Peer graphs for gossip (docs/gossip.md, "Peer graphs"): each graph defines one out-peer rule;
// in-peers are derived from it, so the two never disagree. Lists are sorted, without duplicates
// or the rank itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gossipcc {

class PeerGraph {
 public:
  explicit PeerGraph(int world_size);
  virtual ~PeerGraph() = default;

  int world_size() const { return world_size_; }
  // A short description, e.g. "exponential(peers=1)".
  virtual std::string name() const = 0;
  // Number of steps after which the out-peer pattern repeats (1 for a static graph).
  virtual int64_t period() const = 0;

  // Ranks `rank` sends to at `step` (step >= 0).
  std::vector<int> OutPeers(int rank, int64_t step) const;
  // Ranks `rank` receives from at `step`, derived from every rank's OutPeers.
  std::vector<int> InPeers(int rank, int64_t step) const;
  // Uniform mixing: the share a rank keeps and sends to each out-peer, 1/(|out|+1).
  double UniformShare(int rank, int64_t step) const;
  // True if at `step` every edge i->j has its reverse j->i.
  bool IsSymmetricAt(int64_t step) const;

 protected:
  // The rule, for a checked rank and step mod period(); duplicates and self are removed.
  virtual std::vector<int> RawOutPeers(int rank, int64_t step) const = 0;

 private:
  void CheckRank(int rank) const;
  int world_size_;
};

int CeilLog2(int n);  // ceil(log2 n) for n >= 1 (0 for n == 1)

// one-peer (peers == 1) or n-peer exponential (SGP): out(i,k) = { i + j*(p+1)^(k mod T) : j=1..p },
// T = floor(log_{p+1}(n-1)) + 1 (= ceil(log2 n) for p == 1).
std::unique_ptr<PeerGraph> MakeExponentialGraph(int world_size, int peers = 1);
// SGP graph 0: one peer per step, cycling through offsets +1, -1, +2, -2, +4, -4, ... (< n).
std::unique_ptr<PeerGraph> MakeDirectedExponentialGraph(int world_size);
// SGP graph 1: one peer per step cycling through offsets +1, -1, +(1+2^m), -(1+2^m) (m >= 1);
// even ranks only talk to odd ranks. world_size must be even (or 1).
std::unique_ptr<PeerGraph> MakeBipartiteExponentialGraph(int world_size);
// Static ring: {i+1} if directed, else {i-1, i+1}.
std::unique_ptr<PeerGraph> MakeRingGraph(int world_size, bool directed = false);
// Static: every other rank.
std::unique_ptr<PeerGraph> MakeCompleteGraph(int world_size);
// Static: {i + 2^m : m = 0..ceil(log2 n)-1}.
std::unique_ptr<PeerGraph> MakeStaticExponentialGraph(int world_size);
// Pairwise: partner(i,k) = i XOR 2^(k mod log2 n); world_size must be a power of two.
std::unique_ptr<PeerGraph> MakeHypercubeGraph(int world_size);

using Edge = std::pair<int, int>;  // a directed edge src -> dst
// User edge lists: phases[k mod phases.size()] is step k's edge set. InvalidArgumentError naming
// the edge or rank: no phases, a rank out of range, a self loop, a duplicate, not strongly connected.
std::unique_ptr<PeerGraph> MakeEdgeListGraph(int world_size, std::vector<std::vector<Edge>> phases);

// Parses "name[:key=value,...]" or "edges:0>1,1>2;..." (the specs: docs/gossip.md);
// InvalidArgumentError listing the valid names and keys on bad input.
std::unique_ptr<PeerGraph> MakePeerGraph(const std::string& spec, int world_size);

}  // namespace gossipcc
