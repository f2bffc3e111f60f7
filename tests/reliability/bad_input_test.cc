// Bad input and misuse not covered by tests/comm/errors_test.cc: NaN/Inf (documented IEEE
// behaviour, identical on every rank), calls from several threads, a Work outliving its
// Communicator, shutdown while another thread waits, a store that rejects heartbeats. Each case
// checks that a valid collective succeeds afterwards (where the communicator survives).
#include <gloo/rendezvous/hash_store.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

CommunicatorOptions Quick(int ms = 2000) {
  CommunicatorOptions o;
  o.timeout = Ms(ms);
  o.rendezvous_timeout = std::chrono::seconds(60);  // a safety net: connecting may be slow
  return o;
}

void ExpectWorks(Communicator& comm) {
  std::vector<float> ok(5, 1.0f);
  comm.allreduce(CpuBuffer(ok.data(), ok.size()))->wait();
  EXPECT_EQ(ok[4], static_cast<float>(comm.size()));
}

class BadInputTest : public ::testing::TestWithParam<LaunchMode> {};

// Documented: no NaN/Inf check on the exact collectives (it would cost a pass over the data);
// sum/avg/product follow IEEE, min/max propagate NaN (as torch.maximum and NCCL), and every
// rank gets the same result whichever rank held the NaN.
TEST_P(BadInputTest, NanAndInfFollowIeeeIdenticallyOnEveryRank) {
  RunRanks(3, GetParam(), [](Communicator& comm) {
    const int r = comm.rank();
    // [NaN on rank 1][+Inf on 0, -Inf on 2][+Inf on 0 only][finite]
    std::vector<float> v = {r == 1 ? kNaN : 1.0f, r == 0 ? kInf : (r == 2 ? -kInf : 0.0f), r == 0 ? kInf : 1.0f,
                            2.0f};
    std::vector<float> sum = v, mx = v, mn = v;
    comm.allreduce(CpuBuffer(sum.data(), 4), ReduceOp::kSum)->wait();
    EXPECT_TRUE(std::isnan(sum[0]));
    EXPECT_TRUE(std::isnan(sum[1]));  // Inf + -Inf
    EXPECT_EQ(sum[2], kInf);
    EXPECT_EQ(sum[3], 6.0f);
    comm.allreduce(CpuBuffer(mx.data(), 4), ReduceOp::kMax)->wait();
    comm.allreduce(CpuBuffer(mn.data(), 4), ReduceOp::kMin)->wait();
    EXPECT_TRUE(std::isnan(mx[0])) << "max drops the NaN of rank 1";
    EXPECT_TRUE(std::isnan(mn[0])) << "min drops the NaN of rank 1";
    EXPECT_EQ(mx[1], kInf);
    EXPECT_EQ(mn[1], -kInf);
    // float16 goes through float32: same rules.
    std::vector<uint16_t> h = {static_cast<uint16_t>(r == 2 ? 0x7e00 : 0x3c00)};  // NaN on rank 2, else 1.0
    comm.allreduce(Buffer{h.data(), 1, DType::kFloat16, Device::CPU()}, ReduceOp::kMax)->wait();
    EXPECT_EQ(h[0] & 0x7c00, 0x7c00);
    EXPECT_NE(h[0] & 0x03ff, 0) << "float16 max lost the NaN";
    ExpectWorks(comm);
  }, Quick());
}

// Documented: push-sum does not scan for NaN/Inf; a NaN travels along the graph's edges like
// any value, the weights stay finite and the round completes.
TEST_P(BadInputTest, NanInPushSumTravelsAlongEdgesAndTheRoundCompletes) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    PushSum ps(MakePeerGraph("ring:directed=1", 4));
    std::vector<double> x(3, 1.0);
    if (comm.rank() == 0) x[1] = std::numeric_limits<double>::quiet_NaN();
    ps.Step(comm, {CpuBuffer(x.data(), 3)});
    EXPECT_EQ(ps.step(), 1);
    EXPECT_TRUE(std::isfinite(ps.weight()));
    EXPECT_EQ(std::isnan(x[1]), comm.rank() == 0 || comm.rank() == 1) << "rank 0 sends to rank 1 only";
    EXPECT_FALSE(std::isnan(x[0]));
    ExpectWorks(comm);
  }, Quick());
}

// Documented: a Communicator may be called from several threads. Collectives match in the order
// each rank issues them; ranks whose threads interleave differently get a MismatchError (the
// signatures differ), never a silent mix-up, and the communicator stays usable.
TEST_P(BadInputTest, CollectivesFromSeveralThreadsMismatchCleanlyNeverCorrupt) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    std::atomic<int> ok{0}, mismatched{0}, wrong{0};
    auto reducer = [&] {
      for (int i = 0; i < 20; ++i) {
        std::vector<float> v(8, 1.0f);
        try {
          comm.allreduce(CpuBuffer(v.data(), 8))->wait();
          (v[7] == 2.0f ? ok : wrong)++;
        } catch (const MismatchError&) {
          mismatched++;
        }
      }
    };
    auto gatherer = [&] {
      for (int i = 0; i < 20; ++i) {
        std::vector<int32_t> in(3, comm.rank()), out(6, -1);
        try {
          comm.allgather(CpuBuffer(in.data(), 3), CpuBuffer(out.data(), 6))->wait();
          (out[0] == 0 && out[5] == 1 ? ok : wrong)++;
        } catch (const MismatchError&) {
          mismatched++;
        }
      }
    };
    std::thread a(reducer), b(gatherer);
    a.join();
    b.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_EQ(ok.load() + mismatched.load(), 40);
    ExpectWorks(comm);
  }, Quick());
}

// Point-to-point from several threads, each with its own tag: fully supported, data intact.
TEST_P(BadInputTest, PointToPointFromSeveralThreadsWithTheirOwnTags) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    const int peer = 1 - comm.rank();
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (uint32_t t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 25; ++i) {
          std::vector<float> out(100, static_cast<float>(comm.rank() * 1000 + t * 100 + i)), in(100, -1.0f);
          std::vector<P2POp> ops = {P2POp::Send(CpuBuffer(out.data(), 100), peer, t),
                                    P2POp::Recv(CpuBuffer(in.data(), 100), peer, t)};
          comm.p2p(ops)->wait();
          if (in[99] != static_cast<float>(peer * 1000 + t * 100 + i)) bad++;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(bad.load(), 0);
    ExpectWorks(comm);
  }, Quick());
}

// A Work (and a receive that is never matched) outliving the Communicator: destroying the
// communicator fails or finishes them, bounded by the timeout, and waiting on them afterwards is
// safe (no use after free; ASan checks).
TEST_P(BadInputTest, WorkOutlivesItsCommunicator) {
  RunRanksWithStore(2, GetParam(), [](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(store, rank, 2, Quick(1000));
    std::vector<float> v(1000, 1.0f), never(4);
    comm->barrier()->wait();
    std::shared_ptr<Work> reduce = comm->allreduce(CpuBuffer(v.data(), v.size()));
    std::shared_ptr<Work> orphan = comm->recv(CpuBuffer(never.data(), 4), 1 - rank, 99);  // nobody sends
    reduce->wait();  // both ranks issued it: it completes
    const auto start = Clock::now();
    comm.reset();
    // Bounded by the timeout (1 s): a safety net 10x that, against a destructor that waits for
    // the orphan forever, not a speed check.
    const auto took = std::chrono::duration_cast<Ms>(Clock::now() - start);
    EXPECT_LT(took.count(), 10000) << CurrentTestName() << ": rank " << rank << "'s communicator took " << took.count()
                                   << " ms to go with an unmatched receive (timeout 1000 ms)";
    EXPECT_TRUE(orphan->is_completed());
    EXPECT_THROW(orphan->wait(), CommError);
    EXPECT_EQ(v[0], 2.0f);
  });
}

// Waits on `start()`'s Work on another thread, shuts `comm` down from this one after 100 ms,
// and expects both to end within the timeout, the wait with an error.
void ExpectShutdownEndsAWaiter(Communicator& comm, const std::function<std::shared_ptr<Work>()>& start) {
  std::atomic<bool> waited_with_error{false};
  std::thread waiter([&] {
    try {
      start()->wait();
    } catch (const CommError&) {
      waited_with_error = true;
    }
  });
  std::this_thread::sleep_for(Ms(100));
  const auto begin = Clock::now();
  comm.shutdown();
  waiter.join();
  // Bounded by the running operation's own timeout (1.5 s in these tests): a safety net 10x
  // that, against a shutdown or a waiter that hangs, not a speed check.
  const auto took = std::chrono::duration_cast<Ms>(Clock::now() - begin);
  EXPECT_LT(took.count(), 15000) << CurrentTestName() << ": rank " << comm.rank() << ": shutdown and the waiter took "
                                 << took.count() << " ms (timeout 1500 ms)";
  EXPECT_TRUE(waited_with_error.load()) << CurrentTestName() << ": rank " << comm.rank();
}

// shutdown() from one thread while another waits on a receive that will never match: the wait
// ends with an error and shutdown returns, both within the timeout; later calls raise
// AbortedError naming the shutdown.
TEST_P(BadInputTest, ShutdownWhileAnotherThreadWaits) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    std::vector<float> f(4);
    comm.barrier()->wait();
    ExpectShutdownEndsAWaiter(comm, [&] { return comm.recv(CpuBuffer(f.data(), 4), 1 - comm.rank(), 7); });
    try {
      comm.allreduce(CpuBuffer(f.data(), 4));
      ADD_FAILURE() << "allreduce after shutdown was accepted";
    } catch (const AbortedError& e) {
      EXPECT_THAT(e.what(), HasSubstr("shut down"));
    }
  }, Quick(1500));
}

// A thread blocked in an untimed wait() runs its collective itself (inline); shutdown() from
// another thread must still return, and the waiter must get an error, not hang.
TEST_P(BadInputTest, ShutdownWhileAnotherThreadRunsACollectiveInline) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    std::vector<float> f(4, 1.0f);
    comm.barrier()->wait();
    if (comm.rank() == 1) {  // never joins the all-reduce
      std::this_thread::sleep_for(Ms(300));
      comm.shutdown();
      return;
    }
    ExpectShutdownEndsAWaiter(comm, [&] { return comm.allreduce(CpuBuffer(f.data(), 4)); });
    EXPECT_EQ(f[0], 1.0f) << "a failed all-reduce left the buffer alone";
  }, Quick(1500));
}

// Communicator::UnresponsivePeers(): empty while everyone is up, then names a peer that shut
// down (its heartbeat says "down"). A live peer counts as silent when its heartbeat does not
// move for 3 intervals: with the default interval here (200 ms) a TSan run of the forked ranks
// on a loaded 2-core CI machine once starved the heartbeat threads that long, so the interval
// is 1 s (a shut-down peer is named at once whatever the interval: it wrote "down").
TEST_P(BadInputTest, UnresponsivePeersNamesAPeerThatShutDown) {
  RunRanksWithStore(3, GetParam(), [](int rank, std::shared_ptr<Store> store) {
    CommunicatorOptions options = Quick();
    options.heartbeat_interval = Ms(1000);
    auto comm = Communicator::Create(store, rank, 3, options);
    EXPECT_TRUE(comm->UnresponsivePeers().empty());
    comm->barrier()->wait();
    if (rank == 2) {
      comm->shutdown();  // has written "down" when it returns
      store->set("shut_down/2", {'1'});
      return;
    }
    // Not a sleep: on a loaded machine rank 2 may take any time to get there.
    store->wait({"shut_down/2"}, std::chrono::seconds(60));
    EXPECT_EQ(comm->UnresponsivePeers(), std::vector<int>{2});
    // Neither of the two may shut down before the other has checked.
    store->set(absl::StrCat("checked/", rank), {'1'});
    store->wait({"checked/0", "checked/1"}, std::chrono::seconds(10));
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, BadInputTest, ::testing::ValuesIn(LaunchModes()),
                         [](const ::testing::TestParamInfo<LaunchMode>& info) { return LaunchModeName(info.param); });

// A store that accepts each key once (Gloo's own, through WrapGlooStore) cannot hold heartbeats:
// the communicator works, and a failure says the peer check is unavailable rather than blaming
// a healthy peer.
TEST(BadStoreTest, WriteOnceStoreDisablesThePeerCheckHonestly) {
  auto store = WrapGlooStore(std::make_shared<gloo::rendezvous::HashStore>());
  RunRanksWithStore(2, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> signals) {
    CommunicatorOptions o = Quick(1000);
    o.heartbeat_interval = Ms(50);
    auto comm = Communicator::Create(store, rank, 2, o);
    ExpectWorks(*comm);
    std::this_thread::sleep_for(Ms(200));  // a few heartbeats: the store rejects the second
    if (rank == 0) {
      std::vector<float> f(4);
      try {
        comm->recv(CpuBuffer(f.data(), 4), 1, 5)->wait();
        ADD_FAILURE() << "receive from a silent peer succeeded";
      } catch (const TimeoutError& e) {
        EXPECT_THAT(e.what(), HasSubstr("peer check on rank 0 unavailable"));
        EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("not responding")));
      }
      signals->set("checked", {'1'});
    } else {
      // Stays connected until rank 0's receive has timed out and been checked (its leaving
      // would end that receive with a closed connection instead); not a sleep, which a loaded
      // machine can outlast.
      signals->wait({"checked"}, std::chrono::seconds(60));
    }
  });
}

// A store whose heartbeat writes can be held for chosen ranks (set() blocks until released):
// their heartbeats stop, as when the store stalls or the machine starves their threads.
class HeartbeatGateStore : public Store {
 public:
  explicit HeartbeatGateStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  void Hold(std::vector<int> ranks) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = std::move(ranks);
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_.clear();
    }
    cv_.notify_all();
  }
  void set(const std::string& key, const std::vector<char>& value) override {
    const size_t at = key.rfind("heartbeat/");
    if (at != std::string::npos) {
      const int rank = std::stoi(key.substr(at + std::string("heartbeat/").size()));
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return std::find(held_.begin(), held_.end(), rank) == held_.end(); });
    }
    inner_->set(key, value);
  }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(key, timeout);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<Store> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> held_;
};

// Three ranks on a HeartbeatGateStore with a 100 ms heartbeat: once all are connected, rank 0
// holds the heartbeats of `held`, then expects UnresponsivePeers() to be `unresponsive` and a
// receive from `quiet_peer` (which never sends) to time out with a TimeoutError that
// `check_error` inspects; the heartbeats are released before the ranks shut down.
void RunWithHeldHeartbeats(std::vector<int> held, const std::vector<int>& unresponsive, int quiet_peer,
                           const std::function<void(const std::string&)>& check_error) {
  auto gate = std::make_shared<HeartbeatGateStore>(MakeHashStore());
  RunRanksWithStore(3, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store>) {
    CommunicatorOptions o = Quick(1000);
    o.heartbeat_interval = Ms(100);
    auto comm = Communicator::Create(gate, rank, 3, o);
    comm->barrier()->wait();
    if (rank == 0) {
      gate->Hold(held);
      EXPECT_EQ(comm->UnresponsivePeers(), unresponsive);
      std::vector<float> f(4);
      try {
        comm->recv(CpuBuffer(f.data(), 4), quiet_peer, 5)->wait();
        ADD_FAILURE() << "a receive nobody sends to succeeded";
      } catch (const TimeoutError& e) {
        check_error(e.what());
      }
      gate->Release();
      gate->set("checked", {'1'});
    } else {
      gate->wait({"checked"}, std::chrono::seconds(20));
    }
  });
}

// When every heartbeat stops at once, this rank's included, a peer's silence is no evidence:
// neither UnresponsivePeers() nor a failure's peer check may name a live peer (both did when
// the window was 3 intervals of wall time), and the failure says why it names nobody.
TEST(PeerCheckTest, AStallThatStopsThisRanksOwnHeartbeatNamesNoPeer) {
  RunWithHeldHeartbeats({0, 1, 2}, {}, /*quiet_peer=*/1, [](const std::string& what) {
    EXPECT_THAT(what, HasSubstr("this rank's own heartbeat advanced only 0 times (2 needed) in 600 ms and no peer's advanced"));
    EXPECT_THAT(what, ::testing::Not(HasSubstr(" is not responding")));
    EXPECT_THAT(what, ::testing::Not(HasSubstr(" are not responding")));
  });
}

// The other side of the same rule: this rank's own heartbeat stalls, but a live peer's keeps
// going, so the heartbeats evidently work and a peer whose heartbeat stopped (rank 2, held as a
// hung rank would be) is named, by UnresponsivePeers() and by a failure's peer check.
TEST(PeerCheckTest, APeerSilentWhileAnotherAdvancesIsNamedEvenIfThisRanksOwnStalls) {
  RunWithHeldHeartbeats({0, 2}, {2}, /*quiet_peer=*/2, [](const std::string& what) {
    EXPECT_THAT(what, HasSubstr("rank 2 is not responding"));
    EXPECT_THAT(what, ::testing::Not(HasSubstr("own heartbeat advanced only")));
  });
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
