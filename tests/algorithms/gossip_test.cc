// The spec's properties, run over real communicators: n = 1..8 ranks, as threads and as
// processes. Small buffers (property checks, not throughput). Every rank checks global
// quantities (sums, equality across ranks) through an allgather of its values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "algorithms/async_bilateral_exchange.h"
#include "algorithms/bilateral_exchange.h"
#include "algorithms/elastic_averaging.h"
#include "algorithms/overlapped_push_sum.h"
#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "algorithms/symmetric_gossip.h"
#include "algorithms/uneven_allreduce_sgd.h"
#include "comm/core/errors.h"
#include "comm/core/reduce.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::HasSubstr;

constexpr size_t kCount = 5;  // elements per rank in property checks

// Every rank's vector (all the same length), gathered on every rank.
std::vector<std::vector<double>> Gather(Communicator& comm, const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * comm.size());
  comm.allgather(CpuBuffer(mine.data(), mine.size()), CpuBuffer(all.data(), all.size()))->wait();
  std::vector<std::vector<double>> out(comm.size());
  for (int r = 0; r < comm.size(); ++r)
    out[r].assign(all.begin() + r * mine.size(), all.begin() + (r + 1) * mine.size());
  return out;
}

// Small integers: sums and halvings stay exact in every floating dtype.
double IntValue(int rank, size_t i) { return static_cast<double>(((rank * 37 + static_cast<int>(i) * 11) % 17) - 8); }

std::vector<double> ColumnSums(const std::vector<std::vector<double>>& all) {
  std::vector<double> s(all[0].size(), 0.0);
  for (const auto& v : all) {
    for (size_t i = 0; i < v.size(); ++i) s[i] += v[i];
  }
  return s;
}

void ExpectRelNear(double a, double b, double rel, const std::string& what) {
  EXPECT_LE(std::abs(a - b), rel * std::max(1.0, std::max(std::abs(a), std::abs(b))))
      << what << ": " << a << " vs " << b;
}

using Param = std::tuple<LaunchMode, int>;

class GossipTest : public ::testing::TestWithParam<Param> {
 protected:
  LaunchMode mode() const { return std::get<0>(GetParam()); }
  int n() const { return std::get<1>(GetParam()); }
  void Run(const std::function<void(Communicator&)>& body) { RunRanks(n(), mode(), body); }
};

// one-peer exponential, (1/2, 1/2) push-sum: weights stay exactly 1 and, for n a power of
// two, every rank holds exactly the mean after tau rounds from every starting phase (float32
// and float64, integer inputs). For other n: sums conserved, weights conserved.
TEST_P(GossipTest, OnePeerExponentialExactAverage) {
  const int n = this->n();
  const int tau = CeilLog2(n);
  const bool pow2 = (n & (n - 1)) == 0;
  Run([&](Communicator& comm) {
    auto graph = std::shared_ptr<const PeerGraph>(MakePeerGraph("exponential", n));
    for (int phase = 0; phase < std::max(1, tau); ++phase) {
      std::vector<double> x(kCount);
      std::vector<float> xf(kCount);
      for (size_t i = 0; i < kCount; ++i) xf[i] = static_cast<float>(x[i] = IntValue(comm.rank() + phase, i));
      const std::vector<double> sums = ColumnSums(Gather(comm, x));
      PushSum ps64(graph), ps32(graph);
      ps64.Restore(phase, 1.0);
      ps32.Restore(phase, 1.0);
      for (int k = 0; k < tau; ++k) {
        ps64.Step(comm, {CpuBuffer(x.data(), kCount)});
        ps32.Step(comm, {CpuBuffer(xf.data(), kCount)});
        EXPECT_EQ(ps64.weight(), 1.0);
        EXPECT_EQ(ps32.weight(), 1.0);
      }
      EXPECT_EQ(ps64.step(), phase + tau);
      for (size_t i = 0; i < kCount; ++i) {
        if (pow2) {
          EXPECT_EQ(x[i], sums[i] / n) << "rank " << comm.rank() << " phase " << phase << " element " << i;
          EXPECT_EQ(xf[i], static_cast<float>(sums[i] / n)) << "float32, rank " << comm.rank() << " phase " << phase;
        }
      }
      const std::vector<double> after = ColumnSums(Gather(comm, x));
      for (size_t i = 0; i < kCount; ++i) ExpectRelNear(after[i], sums[i], 1e-12, "sum conserved");
    }
  });
}

// Random doubles: within ~tau * eps * max|x| of the mean after tau rounds (n a power of two).
TEST_P(GossipTest, OnePeerExponentialRandomDoubles) {
  const int n = this->n();
  if ((n & (n - 1)) != 0) GTEST_SKIP() << "exact averaging in tau rounds holds for powers of two only";
  const int tau = CeilLog2(n);
  Run([&](Communicator& comm) {
    std::mt19937_64 rng(100 + comm.rank());
    std::uniform_real_distribution<double> u(-1e3, 1e3);
    std::vector<double> x(kCount);
    for (double& v : x) v = u(rng);
    const auto all0 = Gather(comm, x);
    const std::vector<double> sums = ColumnSums(all0);
    double maxabs = 0;
    for (const auto& v : all0) {
      for (double e : v) maxabs = std::max(maxabs, std::abs(e));
    }
    PushSum ps(std::shared_ptr<const PeerGraph>(MakePeerGraph("exponential", n)));
    for (int k = 0; k < tau; ++k) ps.Step(comm, {CpuBuffer(x.data(), kCount)});
    for (size_t i = 0; i < kCount; ++i) {
      EXPECT_LE(std::abs(x[i] - sums[i] / n), (tau + 1) * 2.3e-16 * maxabs) << "element " << i;
    }
  });
}

// Reference push-sum on the peer tables, in the implementation's arithmetic order
// (keep * x_i + sum over in-peers ascending of share_j * x_j).
void ReferencePushSumRound(const PeerGraph& g, int64_t step, std::vector<std::vector<double>>& x,
                           std::vector<double>& w, const MixingFn& mixing = nullptr) {
  const int n = g.world_size();
  std::vector<std::vector<double>> nx = x;
  std::vector<double> nw = w;
  // share_to[j][i]: what rank j sends to rank i this step (keep at [j][j]).
  std::vector<std::vector<double>> share_to(n, std::vector<double>(n, 0.0));
  for (int j = 0; j < n; ++j) {
    const PushSumPlan plan = MakePushSumPlan(g, mixing, j, step);
    share_to[j][j] = plan.keep;
    for (size_t q = 0; q < plan.out_peers.size(); ++q) share_to[j][plan.out_peers[q]] = plan.send_shares[q];
  }
  for (int i = 0; i < n; ++i) {
    const double keep = share_to[i][i];
    nw[i] = keep * w[i];
    for (size_t e = 0; e < x[i].size(); ++e) nx[i][e] = keep * x[i][e];
    for (int j : g.InPeers(i, step)) {
      const double s = share_to[j][i];
      nw[i] += s * w[j];
      for (size_t e = 0; e < x[i].size(); ++e) nx[i][e] += s * x[j][e];
    }
  }
  x = nx;
  w = nw;
}

double MaxDeviation(const std::vector<std::vector<double>>& z, const std::vector<double>& mean) {
  double d = 0;
  for (const auto& v : z) {
    for (size_t e = 0; e < v.size(); ++e) d = std::max(d, std::abs(v[e] - mean[e]));
  }
  return d;
}

// Runs `rounds` push-sum rounds of `graph` on every rank's x (rank r starts from init(r)) and
// checks: each round, sum x and sum w conserved (relative 1e-12); the final x and w equal the
// reference computed from the peer tables; z = x / w contracted towards the mean by `factor`.
void CheckPushSum(Communicator& comm, std::shared_ptr<const PeerGraph> graph, int rounds, double factor,
                  const std::function<std::vector<double>(int)>& init, bool expect_weights_move,
                  MixingFn mixing = nullptr) {
  const int n = comm.size();
  std::vector<std::vector<double>> ref_x(n);
  for (int r = 0; r < n; ++r) ref_x[r] = init(r);
  std::vector<double> ref_w(n, 1.0);
  const size_t count = ref_x[0].size();
  std::vector<double> mean(count, 0.0), sums(count, 0.0);
  for (int r = 0; r < n; ++r) {
    for (size_t e = 0; e < count; ++e) sums[e] += ref_x[r][e];
  }
  for (size_t e = 0; e < count; ++e) mean[e] = sums[e] / n;
  const double dev0 = MaxDeviation(ref_x, mean);

  // Two buffers, to exercise packing.
  std::vector<double> x = ref_x[comm.rank()];
  const size_t split = count / 2;
  PushSum ps(graph, mixing);
  std::vector<double> history;  // per round: x then w
  for (int k = 0; k < rounds; ++k) {
    ps.Step(comm, {CpuBuffer(x.data(), split), CpuBuffer(x.data() + split, count - split)});
    history.insert(history.end(), x.begin(), x.end());
    history.push_back(ps.weight());
    ReferencePushSumRound(*graph, k, ref_x, ref_w, mixing);
  }
  const auto all = Gather(comm, history);
  double min_w = 1, max_w = 1;
  for (int k = 0; k < rounds; ++k) {
    const size_t base = k * (count + 1);
    for (size_t e = 0; e < count; ++e) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += all[r][base + e];
      ExpectRelNear(s, sums[e], 1e-12, absl::StrCat(graph->name(), ": sum x, round ", k));
    }
    double sw = 0;
    for (int r = 0; r < n; ++r) {
      sw += all[r][base + count];
      min_w = std::min(min_w, all[r][base + count]);
      max_w = std::max(max_w, all[r][base + count]);
    }
    ExpectRelNear(sw, n, 1e-12, absl::StrCat(graph->name(), ": sum w, round ", k));
  }
  if (expect_weights_move) {
    EXPECT_LT(min_w, max_w) << graph->name() << ": a non-regular graph must move the weights";
  }
  for (size_t e = 0; e < count; ++e) {
    ExpectRelNear(x[e], ref_x[comm.rank()][e], 1e-12, absl::StrCat(graph->name(), ": x vs reference"));
  }
  ExpectRelNear(ps.weight(), ref_w[comm.rank()], 1e-12, graph->name() + ": w vs reference");
  std::vector<std::vector<double>> z(n, std::vector<double>(count));
  for (int r = 0; r < n; ++r) {
    for (size_t e = 0; e < count; ++e)
      z[r][e] = all[r][(rounds - 1) * (count + 1) + e] / all[r][rounds * (count + 1) - 1];
  }
  EXPECT_LE(MaxDeviation(z, mean), factor * dev0 + 1e-12) << graph->name() << ": z converges to the mean";
}

// A non-regular, time-varying user graph (directed): phase 0 is the ring i -> i+1 plus a hub
// 0 -> every rank; phase 1 the reverse ring. Weights move away from 1; sums are conserved;
// z converges to the mean.
TEST_P(GossipTest, PushSumNonRegularTimeVarying) {
  const int n = this->n();
  if (n < 3) GTEST_SKIP() << "every graph on 1 or 2 ranks is regular (covered by PushSumEveryGraph)";
  std::vector<std::string> p0, p1;
  for (int i = 0; i < n; ++i) {
    p0.push_back(absl::StrCat(i, ">", (i + 1) % n));
    if (i >= 2) p0.push_back(absl::StrCat(0, ">", i));
    p1.push_back(absl::StrCat(i, ">", (i + n - 1) % n));
  }
  const std::string spec = absl::StrCat("edges:", absl::StrJoin(p0, ","), ";", absl::StrJoin(p1, ","));
  Run([&](Communicator& comm) {
    CheckPushSum(
        comm, MakePeerGraph(spec, n), 60, 0.05,
        [](int r) {
          std::mt19937_64 rng(7 + r);
          std::uniform_real_distribution<double> u(-10, 10);
          std::vector<double> v(kCount);
          for (double& e : v) e = u(rng);
          return v;
        },
        /*expect_weights_move=*/true);
  });
}

// Every built-in graph with uniform mixing, two buffers per call: conservation per round,
// agreement with the reference, convergence of the de-biased value.
// Under sanitizers each n skips one graph in three of the seven (index k skipped where
// (k + n) % 3 == 0): PushSum::Step's code is the same for every graph, only its peer sets
// differ, and each graph still runs at two thirds of the sweep's n, odd and even (the plain
// build runs every graph at every n; peer_graph_test checks the graphs themselves).
TEST_P(GossipTest, PushSumEveryGraph) {
  const int n = this->n();
  std::vector<std::string> specs;
  const std::vector<std::string> every_n = {"exponential", "exponential:peers=2", "directed_exponential",
                                            "ring",        "ring:directed=1",     "static_exponential",
                                            "complete"};
  for (size_t k = 0; k < every_n.size(); ++k) {
    if (!kSanitizerBuild || (static_cast<int>(k) + n) % 3 != 0) specs.push_back(every_n[k]);
  }
  if ((n & (n - 1)) == 0) specs.push_back("hypercube");
  if (n % 2 == 0 || n == 1) specs.push_back("bipartite_exponential");
  Run([&](Communicator& comm) {
    for (const std::string& s : specs) {
      CheckPushSum(
          comm, MakePeerGraph(s, n), 24, 0.25,
          [](int r) {
            std::vector<double> v(kCount);
            for (size_t i = 0; i < kCount; ++i) v[i] = IntValue(r, i);
            return v;
          },
          /*expect_weights_move=*/false);
    }
  });
}

// Non-uniform column-stochastic mixing (keep 1/2, the rest split 1:2:3... over the out-peers,
// so each peer gets a different share and its own message): conservation and the reference.
TEST_P(GossipTest, PushSumCustomMixing) {
  const int n = this->n();
  MixingFn mixing = [](int, int64_t, const std::vector<int>& out) {
    std::vector<double> shares(out.size() + 1, 0.0);
    shares[0] = out.empty() ? 1.0 : 0.5;
    const double total = out.size() * (out.size() + 1) / 2.0;
    for (size_t j = 0; j < out.size(); ++j) shares[j + 1] = 0.5 * (j + 1) / total;
    return shares;
  };
  Run([&](Communicator& comm) {
    for (const char* spec : {"exponential:peers=2", "static_exponential"}) {
      CheckPushSum(
          comm, MakePeerGraph(spec, n), 30, 0.25,
          [](int r) {
            std::vector<double> v(kCount);
            for (size_t i = 0; i < kCount; ++i) v[i] = IntValue(r, i);
            return v;
          },
          /*expect_weights_move=*/n > 2, mixing);
    }
    const uint64_t before = comm.traffic().p2p_bytes_sent;
    PushSum ps(MakePeerGraph("exponential:peers=2", n), mixing);
    std::vector<float> x(100, 1.0f);
    ps.Step(comm, {CpuBuffer(x.data(), 100)});
    const size_t out = ps.graph().OutPeers(comm.rank(), 0).size();
    EXPECT_EQ(comm.traffic().p2p_bytes_sent - before, out * (100 * sizeof(float) + 24));
  });
}

// Static exponential (regular: weights stay 1): per-round contraction of the deviation from
// the mean never exceeds rho = 1 - 2/(1+tau) (even n).
TEST_P(GossipTest, StaticExponentialContraction) {
  const int n = this->n();
  if (n % 2 != 0) GTEST_SKIP() << "the spec's rho bound is for even n";
  const double rho = 1.0 - 2.0 / (1 + CeilLog2(n));
  Run([&](Communicator& comm) {
    std::mt19937_64 rng(31 + comm.rank());
    std::normal_distribution<double> normal;
    std::vector<double> x(kCount);
    for (double& v : x) v = normal(rng);
    const std::vector<double> mean = [&] {
      auto s = ColumnSums(Gather(comm, x));
      for (double& v : s) v /= n;
      return s;
    }();
    auto deviation = [&] {
      double d = 0;
      for (const auto& v : Gather(comm, x)) {
        for (size_t i = 0; i < kCount; ++i) d += (v[i] - mean[i]) * (v[i] - mean[i]);
      }
      return std::sqrt(d);
    };
    PushSum ps(std::shared_ptr<const PeerGraph>(MakePeerGraph("static_exponential", n)));
    double before = deviation();
    for (int t = 0; t < 8; ++t) {
      ps.Step(comm, {CpuBuffer(x.data(), kCount)});
      EXPECT_EQ(ps.weight(), 1.0);
      const double after = deviation();
      EXPECT_LE(after, rho * before * (1 + 1e-12) + 1e-14) << "round " << t;
      before = after;
    }
  });
}

// D-PSGD: doubly stochastic (Metropolis) mixing, no weight: sums conserved every round, the
// result equals the reference computed from the peer tables, and it converges to the mean.
TEST_P(GossipTest, SymmetricGossipConservesAndConverges) {
  const int n = this->n();
  std::vector<std::string> specs = {"ring", "complete"};
  if ((n & (n - 1)) == 0) specs.push_back("hypercube");
  const int rounds = 30;
  Run([&](Communicator& comm) {
    for (const std::string& s : specs) {
      auto graph = std::shared_ptr<const PeerGraph>(MakePeerGraph(s, n));
      SymmetricGossip sg(graph);
      std::vector<std::vector<double>> ref(n, std::vector<double>(kCount));
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < kCount; ++i) ref[r][i] = IntValue(r, i);
      }
      std::vector<double> sums(kCount, 0.0), mean(kCount);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < kCount; ++i) sums[i] += ref[r][i];
      }
      for (size_t i = 0; i < kCount; ++i) mean[i] = sums[i] / n;
      const double dev0 = MaxDeviation(ref, mean);
      std::vector<double> x = ref[comm.rank()], history;
      for (int k = 0; k < rounds; ++k) {
        sg.Step(comm, {CpuBuffer(x.data(), kCount)});
        history.insert(history.end(), x.begin(), x.end());
        auto next = ref;
        for (int i = 0; i < n; ++i) {
          const auto w = sg.Weights(i, k);
          EXPECT_NEAR(std::accumulate(w.begin(), w.end(), 0.0), 1.0, 1e-15);
          const auto peers = graph->OutPeers(i, k);
          for (size_t e = 0; e < kCount; ++e) {
            double acc = w[0] * ref[i][e];
            for (size_t j = 0; j < peers.size(); ++j) acc += w[j + 1] * ref[peers[j]][e];
            next[i][e] = acc;
          }
        }
        ref = next;
      }
      const auto all = Gather(comm, history);
      for (int k = 0; k < rounds; ++k) {
        for (size_t e = 0; e < kCount; ++e) {
          double sum = 0;
          for (int r = 0; r < n; ++r) sum += all[r][k * kCount + e];
          ExpectRelNear(sum, sums[e], 1e-12, absl::StrCat(s, ": sum, round ", k));
        }
      }
      for (size_t e = 0; e < kCount; ++e) ExpectRelNear(x[e], ref[comm.rank()][e], 1e-12, s + ": vs reference");
      EXPECT_LE(MaxDeviation(ref, mean), 0.05 * dev0 + 1e-12) << s << ": converges";
    }
  });
}

// Synchronous bilateral exchange: every step is a perfect matching (n even; one idle rank
// for odd n), partners end bitwise equal, the sum is conserved exactly (dyadic values).
TEST_P(GossipTest, BilateralExchangePairsAverage) {
  const int n = this->n();
  std::vector<BilateralExchange::Matching> matchings = {BilateralExchange::Matching::kRoundRobin};
  if (n % 2 == 0 || n == 1) matchings.push_back(BilateralExchange::Matching::kBipartiteExponential);
  Run([&](Communicator& comm) {
    for (auto matching : matchings) {
      BilateralExchange bx(matching);
      std::vector<double> x(kCount);
      for (size_t i = 0; i < kCount; ++i) x[i] = IntValue(comm.rank(), i) * 64;
      const std::vector<double> sums = ColumnSums(Gather(comm, x));
      std::vector<double> history;  // per step: x before, x after
      const int steps = 6;
      for (int k = 0; k < steps; ++k) {
        history.insert(history.end(), x.begin(), x.end());
        bx.Step(comm, {CpuBuffer(x.data(), kCount)});
        history.insert(history.end(), x.begin(), x.end());
      }
      const auto all = Gather(comm, history);
      for (int k = 0; k < steps; ++k) {
        const size_t b = 2 * kCount * k, a = b + kCount;
        std::vector<int> seen(n, 0);
        for (int r = 0; r < n; ++r) {
          const int p = bx.Partner(r, k, n);
          if (p < 0) {
            EXPECT_TRUE(n % 2 == 1 || n == 1) << "only odd n leaves a rank idle";
            for (size_t i = 0; i < kCount; ++i) EXPECT_EQ(all[r][a + i], all[r][b + i]);
            continue;
          }
          EXPECT_EQ(bx.Partner(p, k, n), r) << "a matching, step " << k;
          if (matching == BilateralExchange::Matching::kBipartiteExponential) {
            EXPECT_NE(p % 2, r % 2);
          }
          ++seen[r];
          for (size_t i = 0; i < kCount; ++i) {
            EXPECT_EQ(all[r][a + i], all[p][a + i]) << "partners bitwise equal, step " << k;
            EXPECT_EQ(all[r][a + i], (all[r][b + i] + all[p][b + i]) / 2);
          }
        }
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n - n % 2) << "perfect matching, step " << k;
        for (size_t i = 0; i < kCount; ++i) {
          double s = 0;
          for (int r = 0; r < n; ++r) s += all[r][a + i];
          EXPECT_EQ(s, sums[i]) << "sum conserved exactly, step " << k;
        }
      }
      EXPECT_EQ(bx.step(), 6);
    }
  });
}

// OSGP: rounds overlap local updates; at most one in flight; after Flush, sum x equals the
// initial sum plus every local update, sum w = n, and z converges to the mean (no updates).
TEST_P(GossipTest, OverlappedPushSumConservesWithLocalUpdates) {
  const int n = this->n();
  Run([&](Communicator& comm) {
    for (int tau : {0, 1, 2}) {
      auto graph = std::shared_ptr<const PeerGraph>(MakePeerGraph("exponential", n));
      OverlappedPushSum os(graph, tau);
      std::vector<double> x(kCount);
      for (size_t i = 0; i < kCount; ++i) x[i] = IntValue(comm.rank(), i);
      std::vector<double> sums = ColumnSums(Gather(comm, x));
      double added = 0;
      for (int k = 0; k < 12; ++k) {
        os.Step(comm, {CpuBuffer(x.data(), kCount)});
        if (tau == 0) {
          EXPECT_FALSE(os.in_flight());
        }
        if (tau >= 1 && n > 0) {
          EXPECT_TRUE(os.in_flight()) << "tau " << tau << " step " << k;
        }
        const auto st = os.state();
        if (st.in_flight) {
          EXPECT_LE(os.step() - st.round_started_at, tau);
        }
        // A local "optimizer" update while the round is in flight.
        const double delta = 0.25 * (comm.rank() + 1);
        x[0] += delta;
        added += delta;
      }
      EXPECT_EQ(os.rounds(), tau == 0 ? 12 : (tau == 1 ? 12 : 6)) << "tau " << tau;
      os.Flush({CpuBuffer(x.data(), kCount)});
      EXPECT_FALSE(os.in_flight());
      std::vector<double> mine = x;
      mine.push_back(os.weight());
      mine.push_back(added);
      const auto s = ColumnSums(Gather(comm, mine));
      ExpectRelNear(s[0], sums[0] + s[kCount + 1], 1e-12, "sum x with updates");
      for (size_t i = 1; i < kCount; ++i) ExpectRelNear(s[i], sums[i], 1e-12, "sum x");
      ExpectRelNear(s[kCount], n, 1e-12, "sum w");
      // Convergence without updates.
      sums = ColumnSums(Gather(comm, x));
      for (int k = 0; k < 40; ++k) os.Step(comm, {CpuBuffer(x.data(), kCount)});
      os.Flush({CpuBuffer(x.data(), kCount)});
      std::vector<double> z(kCount);
      os.Debias(CpuBuffer(x.data(), kCount), CpuBuffer(z.data(), kCount));
      for (size_t i = 0; i < kCount; ++i)
        EXPECT_NEAR(z[i], sums[i] / n, 1e-3 * (1 + std::abs(sums[i]))) << "tau " << tau;
    }
  });
}

// Asynchronous bilateral exchange: active (odd) ranks exchange with passive peers in turn,
// passive ranks answer whoever comes first; every request is answered once, the sum is
// conserved exactly, and an active rank ends each exchange at a pair average.
TEST_P(GossipTest, AsyncBilateralExchangeConservesSum) {
  const int n = this->n();
  Run([&](Communicator& comm) {
    AsyncBilateralExchange ax;
    std::vector<double> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = IntValue(comm.rank(), i) * 1024;
    const std::vector<double> sums = ColumnSums(Gather(comm, x));
    double served = 0;
    if (AsyncBilateralExchange::IsActive(comm.rank())) {
      auto peers = AsyncBilateralExchange::PassivePeers(comm.rank(), n);
      ASSERT_FALSE(peers.empty());
      for (int p : peers) EXPECT_EQ(p % 2, 0);
      for (int k = 0; k < 3; ++k) {
        const int p = ax.Exchange(comm, {CpuBuffer(x.data(), kCount)});
        EXPECT_EQ(p, peers[k % peers.size()]);
      }
      ax.Finish(comm, {CpuBuffer(x.data(), kCount)});
      served = -3;
    } else {
      served = ax.Serve(comm, {CpuBuffer(x.data(), kCount)});
      EXPECT_TRUE(ax.all_active_finished(comm));
    }
    std::vector<double> mine = x;
    mine.push_back(served);
    const auto s = ColumnSums(Gather(comm, mine));
    for (size_t i = 0; i < kCount; ++i) EXPECT_EQ(s[i], sums[i]) << "element " << i;
    EXPECT_EQ(s[kCount], 0) << "requests sent == requests answered";
  });
}

// Elastic averaging: sum x + c conserved by each averaging, every rank's center identical,
// averaging exactly every tau steps; x and c approach each other.
TEST_P(GossipTest, ElasticAveragingConservesAndAgrees) {
  const int n = this->n();
  Run([&](Communicator& comm) {
    ElasticAveraging ea(/*tau=*/2, /*alpha=*/0.25);
    std::vector<double> x(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = IntValue(comm.rank(), i);
    ea.Initialize(comm, {CpuBuffer(x.data(), kCount)});
    {
      const auto all = Gather(comm, x);
      for (const auto& v : all) EXPECT_EQ(v, all[0]) << "Initialize makes everyone equal to rank 0";
      EXPECT_EQ(ea.center(), x);
    }
    std::vector<double> history;  // per step: x before, x after, center after
    const int steps = 10;
    for (int k = 0; k < steps; ++k) {
      // Local "training": each rank drifts differently.
      for (size_t i = 0; i < kCount; ++i) x[i] += 0.5 * (comm.rank() - static_cast<double>(i));
      history.insert(history.end(), x.begin(), x.end());
      const bool averaged = ea.Step(comm, {CpuBuffer(x.data(), kCount)});
      EXPECT_EQ(averaged, k % 2 == 1) << "step " << k;
      history.insert(history.end(), x.begin(), x.end());
      history.insert(history.end(), ea.center().begin(), ea.center().end());
    }
    const auto all = Gather(comm, history);
    std::vector<double> c_before(kCount);
    for (size_t i = 0; i < kCount; ++i) c_before[i] = IntValue(0, i);  // Initialize: rank 0's values
    for (int k = 0; k < steps; ++k) {
      const size_t base = 3 * kCount * k;
      for (size_t i = 0; i < kCount; ++i) {
        double before = 0, after = 0;
        for (int r = 0; r < n; ++r) {
          before += all[r][base + i];
          after += all[r][base + kCount + i];
          EXPECT_EQ(all[r][base + 2 * kCount + i], all[0][base + 2 * kCount + i]) << "all centers equal, step " << k;
        }
        const double c_after = all[0][base + 2 * kCount + i];
        ExpectRelNear(after + c_after, before + c_before[i], 1e-12, absl::StrCat("sum x + c, step ", k));
        if (k % 2 == 0) {
          EXPECT_EQ(c_after, c_before[i]) << "no averaging at step " << k;
        }
        c_before[i] = c_after;
      }
    }
    EXPECT_EQ(ea.step(), 10);
  });
}

// Elastic averaging against torch-distlearn's AllReduceEA (lua/AllReduceEA.lua), computed here
// for every rank: at every tau-th step, d_r = alpha (x_r - c) (in x's dtype), x_r <- x_r - d_r,
// c <- c + sum_r d_r. tau = 3, alpha = 0.3, and a checkpoint (step, center) restored into a new
// object mid-period (at step 7, between averagings). The local updates are known to every
// rank, so the reference needs no communication. x within a few roundings of the reference
// (the all-reduce sums in its own order), the center likewise, at every step.
template <typename T>
void CheckElasticAveragingReference(Communicator& comm, int n) {
  constexpr int kTau = 3;
  constexpr double kAlpha = 0.3;
  constexpr int kSteps = 14;
  constexpr int kRestoreAt = 7;
  const double tol = std::is_same<T, float>::value ? 2e-6 : 1e-13;
  const char* type = std::is_same<T, float>::value ? "float32" : "float64";
  auto start = [](int r, size_t i) { return static_cast<T>(IntValue(r, i) / 4.0); };
  auto drift = [](int r, int k, size_t i) { return static_cast<T>(0.25 * std::sin(1.0 + 1.7 * r + 0.9 * k + 0.4 * i)); };
  std::vector<std::vector<T>> ref_x(n, std::vector<T>(kCount));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < kCount; ++i) ref_x[r][i] = start(0, i);  // Initialize: rank 0's
  }
  std::vector<double> ref_c(ref_x[0].begin(), ref_x[0].end());
  const int me = comm.rank();
  std::vector<T> x(kCount);
  for (size_t i = 0; i < kCount; ++i) x[i] = start(me, i);
  auto ea = std::make_unique<ElasticAveraging>(kTau, kAlpha);
  ea->Initialize(comm, {CpuBuffer(x.data(), kCount)});
  for (int k = 0; k < kSteps; ++k) {
    if (k == kRestoreAt) {  // checkpoint and restore into a fresh object
      const int64_t step = ea->step();
      std::vector<double> center = ea->center();
      ea = std::make_unique<ElasticAveraging>(kTau, kAlpha);
      ea->Restore(step, std::move(center));
    }
    for (size_t i = 0; i < kCount; ++i) x[i] = x[i] + drift(me, k, i);  // the local "optimizer step"
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < kCount; ++i) ref_x[r][i] = ref_x[r][i] + drift(r, k, i);
    }
    const bool expect_average = (k + 1) % kTau == 0;
    if (expect_average) {
      std::vector<double> sum_d(kCount, 0.0);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < kCount; ++i) {
          const T d = static_cast<T>(kAlpha * (static_cast<double>(ref_x[r][i]) - ref_c[i]));
          ref_x[r][i] = ref_x[r][i] - d;
          sum_d[i] += d;
        }
      }
      for (size_t i = 0; i < kCount; ++i) ref_c[i] += sum_d[i];
    }
    EXPECT_EQ(ea->Step(comm, {CpuBuffer(x.data(), kCount)}), expect_average) << type << " step " << k;
    EXPECT_EQ(ea->step(), k + 1);
    for (size_t i = 0; i < kCount; ++i) {
      const std::string where = absl::StrCat(type, " rank ", me, " step ", k, " element ", i);
      ExpectRelNear(x[i], ref_x[me][i], tol, "x, " + where);
      ExpectRelNear(ea->center()[i], ref_c[i], tol, "center, " + where);
    }
  }
}

TEST_P(GossipTest, ElasticAveragingMatchesReference) {
  const int n = this->n();
  Run([&](Communicator& comm) {
    CheckElasticAveragingReference<double>(comm, n);
    CheckElasticAveragingReference<float>(comm, n);
  });
}

// Uneven steps: rank r runs r + 1 steps; each step divides by the ranks that contributed;
// finished ranks join with zeros until all are done; the final sync is bitwise equal.
TEST_P(GossipTest, UnevenAllReduceSGD) {
  const int n = this->n();
  Run([&](Communicator& comm) {
    UnevenAllReduceSGD sgd;
    const int my_steps = comm.rank() + 1;
    std::vector<float> g(kCount);
    for (int k = 0; k < my_steps; ++k) {
      for (size_t i = 0; i < kCount; ++i) g[i] = static_cast<float>(IntValue(comm.rank(), i + k));
      auto r = sgd.SumAndNormalizeGradients(comm, {CpuBuffer(g.data(), kCount)});
      const int expect = n - k;  // ranks k..n-1 still have a step k
      EXPECT_EQ(r.contributors, expect) << "step " << k;
      EXPECT_EQ(r.still_training, expect);
      for (size_t i = 0; i < kCount; ++i) {
        double sum = 0;
        for (int q = k; q < n; ++q) sum += IntValue(q, i + k);
        EXPECT_FLOAT_EQ(g[i], static_cast<float>(sum / expect)) << "step " << k << " element " << i;
      }
    }
    int joins = 0;
    while (sgd.JoinUntilAllDone(comm, {CpuBuffer(g.data(), kCount)})) ++joins;
    EXPECT_EQ(joins, n - my_steps) << "a finished rank joins once per step others still run";
    EXPECT_EQ(sgd.steps_contributed(), my_steps);
    EXPECT_EQ(sgd.collectives(), n + 1);
    std::vector<double> p(kCount);
    for (size_t i = 0; i < kCount; ++i) p[i] = std::sin(comm.rank() * 3.0 + i) / 3.0;
    sgd.SynchronizeParameters(comm, {CpuBuffer(p.data(), kCount)});
    const auto all = Gather(comm, p);
    for (const auto& v : all) {
      for (size_t i = 0; i < kCount; ++i) EXPECT_EQ(std::memcmp(&v[i], &all[0][i], sizeof(double)), 0);
    }
  });
}

// Push-sum with one peer sends exactly one copy of the data, the weight and the 16-byte
// header (step, scale) per round (measured by the comm layer's counters); with p peers, p copies.
TEST_P(GossipTest, PushSumBytesSent) {
  const int n = this->n();
  Run([&](Communicator& comm) {
    for (int peers : {1, 2}) {
      PushSum ps(std::shared_ptr<const PeerGraph>(MakeExponentialGraph(n, peers)));
      std::vector<float> x(1000, 1.0f);
      for (int k = 0; k < 3; ++k) {
        const size_t out = ps.graph().OutPeers(comm.rank(), ps.step()).size();
        const uint64_t before = comm.traffic().p2p_bytes_sent;
        ps.Step(comm, {CpuBuffer(x.data(), 600), CpuBuffer(x.data() + 600, 400)});
        EXPECT_EQ(comm.traffic().p2p_bytes_sent - before, out * (1000 * sizeof(float) + 16 + 8))
            << "peers " << peers << " step " << k;
        if (n > 1 && peers == 1) {
          EXPECT_EQ(out, 1u);
        }
      }
    }
  });
}

// float16 / bfloat16 are mixed in float32: exact means for small integers.
TEST_P(GossipTest, HalfPrecisionPushSum) {
  const int n = this->n();
  if ((n & (n - 1)) != 0) GTEST_SKIP() << "bit-exact mean after tau rounds needs a power of two";
  Run([&](Communicator& comm) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      std::vector<uint16_t> x(kCount);
      std::vector<double> xd(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        xd[i] = IntValue(comm.rank(), i) * 4;
        x[i] = dtype == DType::kFloat16 ? FloatToHalf(static_cast<float>(xd[i]))
                                        : FloatToBFloat16(static_cast<float>(xd[i]));
      }
      const auto sums = ColumnSums(Gather(comm, xd));
      PushSum ps(std::shared_ptr<const PeerGraph>(MakePeerGraph("exponential", n)));
      for (int k = 0; k < CeilLog2(n); ++k) ps.Step(comm, {Buffer{x.data(), kCount, dtype, Device::CPU()}});
      for (size_t i = 0; i < kCount; ++i) {
        const float v = dtype == DType::kFloat16 ? HalfToFloat(x[i]) : BFloat16ToFloat(x[i]);
        EXPECT_EQ(v, static_cast<float>(sums[i] / n)) << DTypeName(dtype) << " element " << i;
      }
    }
  });
}

// An overlapped round's message is the buffers as they were at StartRound: the caller
// changes them while the round is in flight (here at once, while a 4 MiB message is still
// travelling in 16 segments), and what arrives is still the old values times the share.
// Synchronous rounds send the buffers from their own memory instead; a message that did
// that here would carry the overwritten values.
TEST(OverlappedPushSumMessageTest, CarriesTheBuffersAsTheyWereAtTheStart) {
  RunRanks(2, LaunchMode::kThreads, [](Communicator& comm) {
    constexpr size_t kLarge = size_t{1} << 20;
    const int me = comm.rank();
    OverlappedPushSum os(std::shared_ptr<const PeerGraph>(MakePeerGraph("exponential", 2)), /*tau=*/1);
    std::vector<float> x(kLarge);
    for (size_t i = 0; i < kLarge; ++i) x[i] = static_cast<float>((me + 1) * 1000 + i % 1000);
    os.StartRound(comm, {CpuBuffer(x.data(), kLarge)});
    std::fill(x.begin(), x.end(), 0.0f);  // the local steps overwrite x while the round travels
    os.FinishRound({CpuBuffer(x.data(), kLarge)});
    const int peer = 1 - me;
    for (size_t i = 0; i < kLarge; ++i) {
      ASSERT_EQ(x[i], 0.5f * static_cast<float>((peer + 1) * 1000 + i % 1000)) << "element " << i;
    }
    EXPECT_EQ(os.state().weight, 1.0);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GossipTest,
                         ::testing::ValuesIn(RankSweep()),  // every n; process mode at a few (harness.h)
                         ModeAndRanksName);

}  // namespace
}  // namespace testing
}  // namespace gossipcc
