// Error cases of the gossip collectives: ranks calling with different buffer sizes or step
// numbers (detected, a message naming algorithm, rank, peer, step and sizes, no hang: every
// rank returns, the harness would fail a rank that does not), and bad arguments.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms/async_bilateral_exchange.h"
#include "algorithms/bilateral_exchange.h"
#include "algorithms/elastic_averaging.h"
#include "algorithms/overlapped_push_sum.h"
#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "algorithms/symmetric_gossip.h"
#include "algorithms/uneven_allreduce_sgd.h"
#include "comm/core/errors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

CommunicatorOptions Quick(int timeout_ms = 3000) {
  CommunicatorOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  o.rendezvous_timeout = std::chrono::seconds(60);  // a safety net: connecting may be slow
  return o;
}

std::shared_ptr<const PeerGraph> Graph(const std::string& spec, int n) { return MakePeerGraph(spec, n); }

class GossipErrorsTest : public ::testing::TestWithParam<LaunchMode> {};

// Directed ring 0>1>2>3>0; rank 0 passes 6 elements, the others 5. Rank 1 (receiving from 0)
// and rank 0 (receiving from 3) fail with MismatchError naming both counts; nothing is modified;
// the communicator stays usable for the next round.
TEST_P(GossipErrorsTest, PushSumDifferentBufferSizes) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    PushSum ps(Graph("ring:directed=1", 4));
    const int r = comm.rank();
    std::vector<double> x(r == 0 ? 6 : 5, r + 1.0);
    const std::vector<double> before = x;
    if (r == 0 || r == 1) {
      const std::string msg = ExpectThrow<MismatchError>([&] { ps.Step(comm, {CpuBuffer(x.data(), x.size())}); });
      const int peer = r == 0 ? 3 : 0;
      EXPECT_THAT(msg, AllOf(HasSubstr(absl::StrCat("push_sum step 0 on rank ", r, " of 4")),
                             HasSubstr(absl::StrCat("recv from rank ", peer)), HasSubstr("x float64"),
                             HasSubstr(absl::StrCat(x.size(), " x float64 per message")),
                             HasSubstr("nothing was modified")));
      EXPECT_EQ(x, before);
      EXPECT_EQ(ps.step(), 0);
      EXPECT_EQ(ps.weight(), 1.0);
      ps.Restore(1, 1.0);  // the others moved on to step 1
    } else {
      ps.Step(comm, {CpuBuffer(x.data(), x.size())});
    }
    // Same sizes now: the round goes through.
    x.resize(5);
    ps.Step(comm, {CpuBuffer(x.data(), 5)});
    EXPECT_EQ(ps.step(), 2);
  }, Quick());
}

// Static graph, rank 2 restored to step 7: the messages arrive and their step headers differ.
TEST_P(GossipErrorsTest, PushSumDifferentStepsStaticGraph) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    PushSum ps(Graph("ring:directed=1", 4));
    const int r = comm.rank();
    if (r == 2) ps.Restore(7, 1.0);
    std::vector<float> x(3, 1.0f);
    if (r == 2 || r == 3) {
      const std::string msg = ExpectThrow<MismatchError>([&] { ps.Step(comm, {CpuBuffer(x.data(), 3)}); });
      if (r == 3) {
        EXPECT_THAT(msg, AllOf(HasSubstr("push_sum step 0 on rank 3"), HasSubstr("from rank 2 sent at its step 7"),
                               HasSubstr("same step number")));
      } else {
        EXPECT_THAT(msg, AllOf(HasSubstr("push_sum step 7 on rank 2"), HasSubstr("from rank 1 sent at its step 0")));
      }
      EXPECT_EQ(x, std::vector<float>(3, 1.0f));
      EXPECT_EQ(ps.step(), r == 2 ? 7 : 0);
    } else {
      ps.Step(comm, {CpuBuffer(x.data(), 3)});
    }
  }, Quick());
}

// Time-varying graph, rank 0 one step ahead: its peers differ, so its receive is never
// matched. Rank 0 fails (timeout, or the peer's connection closing when that rank finishes)
// with a message naming the algorithm, step and the hint; no rank hangs.
TEST_P(GossipErrorsTest, PushSumDifferentStepsTimeVaryingGraph) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    PushSum ps(Graph("exponential", 4));
    const int r = comm.rank();
    if (r == 0) ps.Restore(1, 1.0);
    std::vector<double> x(4, 1.0);
    try {
      ps.Step(comm, {CpuBuffer(x.data(), 4)});
      EXPECT_NE(r, 0) << "rank 0 waits for rank 2, which sends to rank 3 at step 0";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr(absl::StrCat("push_sum step ", r == 0 ? 1 : 0, " on rank ", r)));
      EXPECT_THAT(e.what(), AnyOf(HasSubstr("different step number"), HasSubstr("sent at its step")));
      EXPECT_EQ(x, std::vector<double>(4, 1.0));
    }
  }, Quick(2000));
}

TEST_P(GossipErrorsTest, SymmetricAndBilateralDifferentSizesAndSteps) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    const int r = comm.rank();
    {
      BilateralExchange bx;
      std::vector<double> x(r == 0 ? 4 : 5, 1.0);
      const std::string msg = ExpectThrow<MismatchError>([&] { bx.Step(comm, {CpuBuffer(x.data(), x.size())}); });
      EXPECT_THAT(msg, AllOf(HasSubstr(absl::StrCat("bilateral_exchange step 0 on rank ", r, " of 2")),
                             HasSubstr(absl::StrCat("recv from rank ", 1 - r))));
      EXPECT_EQ(bx.step(), 0);
    }
    {
      SymmetricGossip sg(Graph("ring", 2));
      if (r == 1) sg.Restore(3);
      std::vector<float> x(2, 1.0f);
      const std::string msg = ExpectThrow<MismatchError>([&] { sg.Step(comm, {CpuBuffer(x.data(), 2)}); });
      EXPECT_THAT(msg, AllOf(HasSubstr(absl::StrCat("symmetric_gossip step ", r == 1 ? 3 : 0)),
                             HasSubstr(absl::StrCat("sent at its step ", r == 1 ? 0 : 3))));
    }
  }, Quick());
}

// Elastic averaging: a step disagreement is found on every rank before anything changes;
// different sizes are the comm layer's MismatchError on every rank.
// Asynchronous bilateral exchange with x of 4 elements on the active rank and 5 on the
// passive one: both fail with a MismatchError naming the sizes, neither x changes, and an
// exchange with matching sizes then goes through (the message streams stayed in step).
TEST_P(GossipErrorsTest, AsyncBilateralDifferentSizes) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    AsyncBilateralExchange ax;
    const int r = comm.rank();
    std::vector<float> x(r == 1 ? 4 : 5, r + 1.0f);
    const std::vector<float> before = x;
    if (r == 1) {
      const std::string msg = ExpectThrow<MismatchError>([&] { ax.Exchange(comm, {CpuBuffer(x.data(), 4)}); });
      EXPECT_THAT(msg, AllOf(HasSubstr("async_bilateral_exchange request 0 from active rank 1 to passive rank 0"),
                             HasSubstr("expected 4 x float32"), HasSubstr("rank 0 sent 5 x float32")));
    } else {
      const std::string msg = ExpectThrow<MismatchError>([&] { ax.Serve(comm, {CpuBuffer(x.data(), 5)}, 1); });
      EXPECT_THAT(msg, AllOf(HasSubstr("passive rank 0 serving (5 x float32, 0 answered so far, request from rank 1)"),
                             HasSubstr("expected 5 x float32"), HasSubstr("rank 1 sent 4 x float32")));
    }
    EXPECT_EQ(x, before);
    // Matching sizes: one exchange, both end at the average.
    x.assign(4, r + 1.0f);
    if (r == 1) {
      AsyncBilateralExchange again(AsyncBilateralExchange::kDefaultTag + 16);
      again.Exchange(comm, {CpuBuffer(x.data(), 4)});
      again.Finish(comm, {CpuBuffer(x.data(), 4)});
    } else {
      AsyncBilateralExchange again(AsyncBilateralExchange::kDefaultTag + 16);
      EXPECT_EQ(again.Serve(comm, {CpuBuffer(x.data(), 4)}), 1);
    }
    EXPECT_EQ(x, std::vector<float>(4, 1.5f));
  }, Quick());
}

TEST_P(GossipErrorsTest, ElasticAveragingMismatches) {
  RunRanks(3, GetParam(), [](Communicator& comm) {
    const int r = comm.rank();
    std::vector<double> x(4, r);
    ElasticAveraging ea(1, 0.5);
    ea.Initialize(comm, {CpuBuffer(x.data(), 4)});
    if (r == 1) ea.Restore(5, ea.center());
    const std::vector<double> before = x;
    const std::string msg = ExpectThrow<MismatchError>([&] { ea.Step(comm, {CpuBuffer(x.data(), 4)}); });
    EXPECT_THAT(msg, AllOf(HasSubstr(absl::StrCat("elastic_averaging on rank ", r)),
                           HasSubstr("different steps (from 1 to 6)"), HasSubstr("Nothing was modified")));
    EXPECT_EQ(x, before);
    EXPECT_EQ(ea.step(), r == 1 ? 5 : 0);
    // Different sizes.
    ElasticAveraging eb(1, 0.5);
    std::vector<double> y(r == 2 ? 3 : 4, 1.0);
    const std::string msg2 = ExpectThrow<MismatchError>([&] { eb.Initialize(comm, {CpuBuffer(y.data(), y.size())}); });
    EXPECT_THAT(msg2, HasSubstr("element count"));
  }, Quick());
}

TEST_P(GossipErrorsTest, UnevenAllReduceDifferentSizes) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    UnevenAllReduceSGD sgd;
    std::vector<float> g(comm.rank() == 0 ? 7 : 8, 1.0f);
    const std::string msg =
        ExpectThrow<MismatchError>([&] { sgd.SumAndNormalizeGradients(comm, {CpuBuffer(g.data(), g.size())}); });
    EXPECT_THAT(msg, AllOf(HasSubstr("element count"), HasSubstr("rank 0: 9"), HasSubstr("rank 1: 10")));
  }, Quick());
}

INSTANTIATE_TEST_SUITE_P(Modes, GossipErrorsTest, ::testing::ValuesIn(LaunchModes()),
                         [](const ::testing::TestParamInfo<LaunchMode>& info) { return LaunchModeName(info.param); });

// Bad arguments: raised synchronously, naming what is wrong.
TEST(GossipArgumentsTest, RejectedWithClearMessages) {
  RunRanks(2, LaunchMode::kThreads, [](Communicator& comm) {
    const int r = comm.rank();
    PushSum ps(Graph("exponential", 2));
    std::vector<int32_t> ints(4, 1);
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { ps.Step(comm, {CpuBuffer(ints.data(), 4)}); }),
                AllOf(HasSubstr("push_sum: buffer 0 is int32"), HasSubstr("floating dtype")));
    std::vector<float> f(4, 1.0f);
    std::vector<double> d(4, 1.0);
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>(
                    [&] { ps.Step(comm, {CpuBuffer(f.data(), 4), CpuBuffer(d.data(), 4)}); }),
                HasSubstr("buffer 1 is float64 but buffer 0 is float32"));
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { ps.Step(comm, {Buffer{nullptr, 3, DType::kFloat32, {}}}); }),
                HasSubstr("null data"));
    PushSum wrong_size(Graph("ring", 3));
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { wrong_size.Step(comm, {CpuBuffer(f.data(), 4)}); }),
                HasSubstr("is for 3 ranks but the communicator has 2"));
    // Mixing that is not column-stochastic.
    PushSum bad_mix(Graph("exponential", 2), [](int, int64_t, const std::vector<int>&) {
      return std::vector<double>{0.5, 0.4};
    });
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { bad_mix.Step(comm, {CpuBuffer(f.data(), 4)}); }),
                AllOf(HasSubstr(absl::StrCat("mixing shares of rank ", r, " at step 0 sum to 0.9")),
                      HasSubstr("column-stochastic")));
    PushSum neg_mix(Graph("exponential", 2), [](int, int64_t, const std::vector<int>&) {
      return std::vector<double>{1.5, -0.5};
    });
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { neg_mix.Step(comm, {CpuBuffer(f.data(), 4)}); }),
                HasSubstr("is -0.5 (must be finite and >= 0)"));
    PushSum short_mix(Graph("exponential", 2), [](int, int64_t, const std::vector<int>&) {
      return std::vector<double>{1.0};
    });
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { short_mix.Step(comm, {CpuBuffer(f.data(), 4)}); }),
                HasSubstr("returned 1 shares for 1 out-peers"));
    EXPECT_THROW(KeepShareMixing(0.0), InvalidArgumentError);
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { ps.Restore(-1, 1.0); }), HasSubstr("negative step"));
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { ps.Restore(0, 0.0); }), HasSubstr("weight 0"));
    EXPECT_EQ(ps.step(), 0) << "nothing above advanced the step";

    // A graph that is not a matching for bilateral exchange; a directed one for D-PSGD.
    BilateralExchange not_matching(Graph("complete", 2));
    not_matching.Step(comm, {CpuBuffer(f.data(), 4)});  // complete on 2 ranks is a matching
    SymmetricGossip directed(Graph("exponential", 2));  // 2 ranks: i+1 == i-1, symmetric
    directed.Step(comm, {CpuBuffer(f.data(), 4)});

    // OSGP: one round in flight at most; a state with a round in flight cannot be restored.
    OverlappedPushSum os(Graph("exponential", 2), 1);
    os.StartRound(comm, {CpuBuffer(f.data(), 4)});
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { os.StartRound(comm, {CpuBuffer(f.data(), 4)}); }),
                HasSubstr("still in flight"));
    OverlappedPushSum::State st = os.state();
    EXPECT_TRUE(st.in_flight);
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { os.Restore(st); }), HasSubstr("Flush first"));
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { os.FinishRound({CpuBuffer(f.data(), 3)}); }),
                HasSubstr("started on 4 x float32 but is finished on 3 x float32"));
    os.Flush({CpuBuffer(f.data(), 4)});
    EXPECT_FALSE(os.in_flight());
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { os.FinishRound({CpuBuffer(f.data(), 4)}); }),
                HasSubstr("no round in flight"));
    st = os.state();
    OverlappedPushSum restored(Graph("exponential", 2), 1);
    restored.Restore(st);
    EXPECT_EQ(restored.rounds(), 1);
    EXPECT_EQ(restored.weight(), os.weight());
    st.in_flight = true;
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { restored.Restore(st); }), HasSubstr("Flush() before saving"));

    // Async bilateral: roles are fixed by parity.
    AsyncBilateralExchange ax;
    if (r == 0) {
      EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { ax.Exchange(comm, {CpuBuffer(f.data(), 4)}); }),
                  HasSubstr("rank 0 is passive"));
    } else {
      EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { ax.Serve(comm, {CpuBuffer(f.data(), 4)}); }),
                  HasSubstr("rank 1 is active"));
    }
    EXPECT_THROW(ElasticAveraging(0, 0.5), InvalidArgumentError);
    EXPECT_THROW(ElasticAveraging(1, 1.5), InvalidArgumentError);
    ElasticAveraging ea(1, 0.5);
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { ea.Step(comm, {CpuBuffer(d.data(), 4)}); }),
                HasSubstr("call Initialize"));
    UnevenAllReduceSGD sgd;
    EXPECT_THROW(sgd.Restore(3, 2, 0), InvalidArgumentError);  // more steps than collectives
    EXPECT_THROW(sgd.Restore(2, 3, 3), InvalidArgumentError);  // more steps since the sync than in all
  });
}

TEST(GossipArgumentsTest, GraphsThatDoNotFitTheAlgorithm) {
  RunRanks(4, LaunchMode::kThreads, [](Communicator& comm) {
    std::vector<float> f(2, 1.0f);
    BilateralExchange bx(Graph("ring", 4));
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { bx.Step(comm, {CpuBuffer(f.data(), 2)}); }),
                AllOf(HasSubstr("ring is not a matching at step 0"), HasSubstr("rank 0 has 2 out-peers")));
    SymmetricGossip sg(Graph("ring:directed=1", 4));
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { sg.Step(comm, {CpuBuffer(f.data(), 2)}); }),
                AllOf(HasSubstr("not symmetric at step 0"), HasSubstr("undirected")));
    // Both checks happen before anything is sent, so the communicator is still in sync.
    BilateralExchange hyper(Graph("hypercube", 4));
    hyper.Step(comm, {CpuBuffer(f.data(), 2)});
    EXPECT_EQ(hyper.step(), 1);
  });
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
