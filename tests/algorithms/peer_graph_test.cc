// Peer tables without communication: structure of every graph for n = 1..64, the exact
// rules of the exponential/hypercube graphs, averaging properties simulated on the tables,
// user edge-list validation and the spec parser's errors.
#include "algorithms/peer_graph.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms/bilateral_exchange.h"
#include "comm/core/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gossipcc {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> SpecsFor(int n) {
  std::vector<std::string> specs = {"exponential",          "exponential:peers=2", "exponential:peers=3",
                                    "directed_exponential", "ring",                "ring:directed=1",
                                    "complete",             "static_exponential"};
  if ((n & (n - 1)) == 0) specs.push_back("hypercube");
  if (n % 2 == 0 || n == 1) specs.push_back("bipartite_exponential");
  return specs;
}

// Union of edges over steps [start, start + window) is strongly connected.
bool StronglyConnectedOver(const PeerGraph& g, int64_t start, int64_t window) {
  const int n = g.world_size();
  std::vector<std::set<int>> adj(n), radj(n);
  for (int64_t k = start; k < start + window; ++k) {
    for (int i = 0; i < n; ++i) {
      for (int j : g.OutPeers(i, k)) {
        adj[i].insert(j);
        radj[j].insert(i);
      }
    }
  }
  auto all_reached = [n](const std::vector<std::set<int>>& a) {
    std::vector<bool> seen(n, false);
    std::vector<int> st = {0};
    seen[0] = true;
    while (!st.empty()) {
      int v = st.back();
      st.pop_back();
      for (int w : a[v]) {
        if (!seen[w]) seen[w] = true, st.push_back(w);
      }
    }
    return std::all_of(seen.begin(), seen.end(), [](bool b) { return b; });
  };
  return all_reached(adj) && all_reached(radj);
}

TEST(PeerGraphTest, TablesAreConsistentForAllSizes) {
  for (int n = 1; n <= 64; ++n) {
    for (const std::string& spec : SpecsFor(n)) {
      SCOPED_TRACE("n=" + std::to_string(n) + " graph=" + spec);
      auto g = MakePeerGraph(spec, n);
      ASSERT_EQ(g->world_size(), n);
      ASSERT_GE(g->period(), 1);
      const int64_t steps = g->period() + 2;
      for (int64_t k = 0; k < steps; ++k) {
        std::vector<std::vector<int>> out(n), in(n);
        for (int i = 0; i < n; ++i) {
          out[i] = g->OutPeers(i, k);
          in[i] = g->InPeers(i, k);
          for (const auto* list : {&out[i], &in[i]}) {
            std::set<int> uniq(list->begin(), list->end());
            EXPECT_EQ(uniq.size(), list->size()) << "duplicate peer of rank " << i << " at step " << k;
            EXPECT_EQ(uniq.count(i), 0u) << "self loop at rank " << i << " step " << k;
            for (int p : *list) {
              EXPECT_GE(p, 0);
              EXPECT_LT(p, n);
            }
          }
          if (n > 1) {
            EXPECT_FALSE(out[i].empty()) << "rank " << i << " sends nowhere at step " << k;
          }
          EXPECT_NEAR(g->UniformShare(i, k), 1.0 / (out[i].size() + 1), 0);
        }
        // j in Out(i,k) iff i in In(j,k).
        for (int i = 0; i < n; ++i) {
          for (int j = 0; j < n; ++j) {
            bool fwd = std::count(out[i].begin(), out[i].end(), j) > 0;
            bool back = std::count(in[j].begin(), in[j].end(), i) > 0;
            EXPECT_EQ(fwd, back) << "edge " << i << ">" << j << " at step " << k;
          }
        }
        // Periodicity.
        for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], g->OutPeers(i, k + g->period()));
      }
      // Every rank reachable over one period, from any starting phase.
      for (int64_t start = 0; start < g->period(); ++start) {
        EXPECT_TRUE(StronglyConnectedOver(*g, start, g->period())) << "start " << start;
      }
    }
  }
}

TEST(PeerGraphTest, OnePeerExponentialRule) {
  for (int n = 2; n <= 64; ++n) {
    auto g = MakePeerGraph("exponential", n);
    int tau = CeilLog2(n);
    EXPECT_EQ(g->period(), tau) << n;
    for (int64_t k = 0; k < 2 * tau; ++k) {
      for (int i = 0; i < n; ++i) {
        int off = 1 << (k % tau);
        EXPECT_EQ(g->OutPeers(i, k), std::vector<int>{(i + off) % n});
        EXPECT_EQ(g->InPeers(i, k), std::vector<int>{((i - off) % n + n) % n});
      }
    }
  }
}

TEST(PeerGraphTest, NPeerExponentialRule) {
  for (int p : {2, 3}) {
    for (int n = 2; n <= 40; ++n) {
      auto g = MakeExponentialGraph(n, p);
      int t = 0;
      for (int64_t pw = 1; pw <= n - 1; pw *= (p + 1)) ++t;  // floor(log_{p+1}(n-1)) + 1
      EXPECT_EQ(g->period(), t) << "n=" << n << " p=" << p;
      for (int64_t k = 0; k < t; ++k) {
        int64_t base = 1;
        for (int m = 0; m < k % t; ++m) base *= (p + 1);
        for (int i = 0; i < n; ++i) {
          std::set<int> want;
          for (int j = 1; j <= p; ++j) {
            int q = static_cast<int>((i + j * base) % n);
            if (q != i) want.insert(q);
          }
          EXPECT_EQ(g->OutPeers(i, k), std::vector<int>(want.begin(), want.end()));
        }
      }
    }
  }
}

TEST(PeerGraphTest, HypercubeAndRingAndBipartiteRules) {
  for (int n : {2, 4, 8, 16, 32, 64}) {
    auto g = MakePeerGraph("hypercube", n);
    for (int64_t k = 0; k < 12; ++k) {
      for (int i = 0; i < n; ++i) EXPECT_EQ(g->OutPeers(i, k), std::vector<int>{i ^ (1 << (k % CeilLog2(n)))});
      EXPECT_TRUE(g->IsSymmetricAt(k));
    }
  }
  auto ring = MakePeerGraph("ring", 5);
  EXPECT_EQ(ring->OutPeers(0, 7), (std::vector<int>{1, 4}));
  EXPECT_TRUE(ring->IsSymmetricAt(0));
  auto dring = MakePeerGraph("ring:directed=1", 5);
  EXPECT_EQ(dring->OutPeers(4, 0), std::vector<int>{0});
  EXPECT_FALSE(dring->IsSymmetricAt(0));
  for (int n : {2, 4, 6, 10, 16}) {
    auto b = MakePeerGraph("bipartite_exponential", n);
    for (int64_t k = 0; k < b->period(); ++k) {
      for (int i = 0; i < n; ++i) {
        for (int j : b->OutPeers(i, k)) EXPECT_NE(i % 2, j % 2) << "n=" << n << " edge " << i << ">" << j;
      }
    }
  }
}

// Simulated one-peer exponential gossip with (1/2, 1/2) mixing: for n a power of two, every
// rank holds exactly the mean after tau rounds from every starting phase.
TEST(PeerGraphTest, OnePeerExponentialExactAverageSimulated) {
  std::mt19937_64 rng(7);
  for (int n : {2, 4, 8, 16, 32, 64}) {
    auto g = MakePeerGraph("exponential", n);
    const int tau = CeilLog2(n);
    for (int phase = 0; phase < tau; ++phase) {
      std::vector<double> x(n);
      for (int i = 0; i < n; ++i) x[i] = static_cast<double>(static_cast<int>(rng() % 2001) - 1000);
      const double mean = std::accumulate(x.begin(), x.end(), 0.0) / n;
      for (int k = phase; k < phase + tau; ++k) {
        std::vector<double> next(n);
        for (int i = 0; i < n; ++i) {
          double v = 0.5 * x[i];
          for (int j : g->InPeers(i, k)) v += 0.5 * x[j];
          next[i] = v;
        }
        x = next;
      }
      for (int i = 0; i < n; ++i) EXPECT_EQ(x[i], mean) << "n=" << n << " phase=" << phase << " rank " << i;
    }
  }
}

// Static exponential with uniform weights: ||x_t - mean|| <= rho^t ||x_0 - mean||.
TEST(PeerGraphTest, StaticExponentialContraction) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal;
  for (int n : {16, 64}) {
    auto g = MakePeerGraph("static_exponential", n);
    const int tau = CeilLog2(n);
    const double rho = 1.0 - 2.0 / (1 + tau);
    std::vector<double> x(n);
    for (double& v : x) v = normal(rng);
    const double mean = std::accumulate(x.begin(), x.end(), 0.0) / n;
    auto dev = [&](const std::vector<double>& y) {
      double s = 0;
      for (double v : y) s += (v - mean) * (v - mean);
      return std::sqrt(s);
    };
    for (int t = 0; t < 10; ++t) {
      std::vector<double> next(n);
      for (int i = 0; i < n; ++i) {
        double share = g->UniformShare(i, t);
        double v = share * x[i];
        for (int j : g->InPeers(i, t)) v += g->UniformShare(j, t) * x[j];
        next[i] = v;
      }
      double before = dev(x), after = dev(next);
      EXPECT_LE(after, rho * before * (1 + 1e-12) + 1e-15) << "n=" << n << " round " << t;
      x = next;
    }
  }
}

TEST(PeerGraphTest, RoundRobinIsAMatching) {
  for (int n = 1; n <= 16; ++n) {
    std::set<std::pair<int, int>> met;
    const int cycle = n % 2 == 0 ? n - 1 : n;
    for (int64_t k = 0; k < std::max(1, cycle); ++k) {
      int idle = 0;
      for (int i = 0; i < n; ++i) {
        int p = BilateralExchange::RoundRobinPartner(i, k, n);
        if (p < 0) {
          ++idle;
          continue;
        }
        EXPECT_NE(p, i);
        EXPECT_EQ(BilateralExchange::RoundRobinPartner(p, k, n), i) << "n=" << n << " step " << k;
        met.insert({std::min(i, p), std::max(i, p)});
      }
      EXPECT_EQ(idle, n % 2) << "n=" << n << " step " << k;  // perfect for even n, one idle for odd
    }
    EXPECT_EQ(met.size(), static_cast<size_t>(n * (n - 1) / 2)) << "every pair meets once per cycle, n=" << n;
  }
}

template <typename Fn>
std::string InvalidArgumentMessage(Fn fn) {
  try {
    fn();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected InvalidArgumentError";
  return "";
}

TEST(PeerGraphTest, UserEdgeLists) {
  auto g = MakePeerGraph("edges:0>1,1>2,2>0", 3);
  EXPECT_EQ(g->OutPeers(2, 5), std::vector<int>{0});
  EXPECT_EQ(g->InPeers(0, 5), std::vector<int>{2});
  auto per_step = MakePeerGraph("edges:0>1,1>0;1>2,2>1", 3);
  EXPECT_EQ(per_step->period(), 2);
  EXPECT_EQ(per_step->OutPeers(0, 0), std::vector<int>{1});
  EXPECT_TRUE(per_step->OutPeers(0, 1).empty());
  EXPECT_EQ(per_step->InPeers(1, 3), std::vector<int>{2});
  auto from_cpp = MakeEdgeListGraph(2, {{{0, 1}, {1, 0}}});
  EXPECT_EQ(from_cpp->OutPeers(1, 0), std::vector<int>{0});

  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("edges:0>1,1>1,1>0", 2); }),
              HasSubstr("edge 1>1 is a self loop"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("edges:0>1,1>3,1>0", 3); }),
              HasSubstr("edge 1>3 has a rank out of range"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("edges:0>1,1>0,0>1", 2); }),
              HasSubstr("duplicate edge 0>1"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("edges:0>1,1>0", 3); }),
              HasSubstr("rank 2 is never reached"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("edges:0>1,1>0,1>2", 3); }), HasSubstr("rank 2 never sends"));
  // Two strongly connected halves joined one way only: 0 never reached from 2.
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("edges:0>1,1>0,1>2,2>3,3>2", 4); }),
              HasSubstr("rank 0 is never reached from rank 2"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("edges:0>1,1>0;0>0", 2); }),
              HasSubstr("in phase 1"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("edges:0-1", 2); }), HasSubstr("SRC>DST"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("edges:a>1", 2); }), HasSubstr("not an integer"));
}

TEST(PeerGraphTest, SpecsIgnoreCase) {
  // Graph names and option keys in any case are the same graph as in lower case.
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"Ring", "ring"}, {"RING:Directed=1", "ring:directed=1"}, {"Exponential:PEERS=2", "exponential:peers=2"},
      {"Hypercube", "hypercube"}, {"Directed_Exponential", "directed_exponential"}, {"Edges:0>1,1>0", "edges:0>1,1>0"}};
  for (const auto& [spec, lower] : pairs) {
    auto g = MakePeerGraph(spec, 4 - (lower.rfind("edges", 0) == 0 ? 2 : 0));
    auto want = MakePeerGraph(lower, g->world_size());
    EXPECT_EQ(g->name(), want->name()) << spec;
    ASSERT_EQ(g->period(), want->period()) << spec;
    for (int64_t k = 0; k < g->period(); ++k) {
      for (int r = 0; r < g->world_size(); ++r) EXPECT_EQ(g->OutPeers(r, k), want->OutPeers(r, k)) << spec;
    }
  }
}

TEST(PeerGraphTest, SpecParserErrors) {
  std::string msg = InvalidArgumentMessage([] { MakePeerGraph("torus", 4); });
  EXPECT_THAT(msg, HasSubstr("unknown graph 'torus'"));
  EXPECT_THAT(msg, HasSubstr("exponential[:peers=P]"));
  EXPECT_THAT(msg, HasSubstr("hypercube"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("exponential:fanout=2", 4); }),
              HasSubstr("unknown key 'fanout'"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("exponential:fanout=2", 4); }), HasSubstr("valid keys: peers"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("exponential:peers=x", 4); }), HasSubstr("not an integer"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("exponential:peers=0", 4); }), HasSubstr("peers must be >= 1"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("ring:directed=2", 4); }), HasSubstr("0 or 1"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("complete:x=1", 4); }), HasSubstr("valid keys: (none)"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("hypercube", 6); }), HasSubstr("power-of-two"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("bipartite_exponential", 5); }), HasSubstr("even"));
  EXPECT_THAT(InvalidArgumentMessage([] { MakePeerGraph("ring", 0); }), HasSubstr("world size"));
  auto g = MakePeerGraph("ring", 3);
  EXPECT_THAT(InvalidArgumentMessage([&] { g->OutPeers(3, 0); }), HasSubstr("out of range"));
  EXPECT_THAT(InvalidArgumentMessage([&] { g->OutPeers(0, -1); }), HasSubstr("negative step"));
}

}  // namespace
}  // namespace gossipcc

namespace gossipcc {
namespace {

// Fuzz findings (tests/fuzz/findings/peer_graph): a huge `peers` must neither overflow nor
// allocate `peers` entries per call; the peer sets equal those of peers = n (j and j + n give
// the same peer).
TEST(PeerGraphTest, HugePeerCountsAreCheap) {
  for (int peers : {99999999, 2147483647}) {
    auto g = MakePeerGraph(absl::StrCat("exponential:peers=", peers), 4);
    auto ref = MakeExponentialGraph(4, 4);
    EXPECT_EQ(g->period(), 1);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(g->OutPeers(r, 0), ref->OutPeers(r, 0));
      EXPECT_EQ(g->OutPeers(r, 0).size(), 3u);
    }
  }
}

}  // namespace
}  // namespace gossipcc

namespace gossipcc {
namespace {

// AD-PSGD's bipartite matching: for even n, every step pairs each passive (even) rank with
// exactly one active (odd) rank; odd n is refused.
TEST(PeerGraphTest, BipartiteMatchingIsPerfect) {
  for (int n = 2; n <= 64; n += 2) {
    for (int64_t k = 0; k < 2 * (2 * CeilLog2(n) + 2); ++k) {
      for (int i = 0; i < n; ++i) {
        const int p = BilateralExchange::BipartitePartner(i, k, n);
        ASSERT_GE(p, 0) << "n=" << n << " step " << k;
        ASSERT_LT(p, n);
        EXPECT_NE(p % 2, i % 2) << "n=" << n << " step " << k << " rank " << i;
        EXPECT_EQ(BilateralExchange::BipartitePartner(p, k, n), i) << "n=" << n << " step " << k;
      }
    }
  }
  EXPECT_EQ(BilateralExchange::BipartitePartner(0, 3, 1), -1);
  EXPECT_THROW(BilateralExchange::BipartitePartner(0, 0, 5), InvalidArgumentError);
}

}  // namespace
}  // namespace gossipcc
