// CommunicatorOptions::streams_per_peer (comm/gloo/striping.h): with k = 2 and 4 streams per peer
// pair, every payload path that deals its pieces over the streams (the ring all-reduce, point-
// to-point segments, so the push-sum round and the quantized all-reduce) gives the very bits
// that k = 1 gives, on n = 1..8 ranks; failures (a peer that leaves, one that never joins, a
// sender that dies mid-payload) still fail with the named error; the option is range-checked
// and ranks that disagree fail at creation.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include <signal.h>
#include <sys/syscall.h>

#include "absl/strings/str_cat.h"
#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/core/p2p_op.h"
#include "comm/core/transfer_progress.h"
#include "compression/quantized_allreduce.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"
#include "tests/comm/typed_array.h"

namespace gossipcc {
namespace testing {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

// Values whose sums round (so a different order of terms would show in the bits), small
// integers for the integer dtypes (whose sums are exact in any order, but whose messages still
// move through every stream).
void FillFor(TypedArray& a, int rank, uint32_t salt) {
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = 0.37 * static_cast<double>(i) + 1.3 * rank + salt;
    a.set(i, IsFloatingPoint(a.dtype()) ? std::sin(x) / 3.0 : static_cast<double>((i * 7 + rank * 3 + salt) % 9));
  }
}

Bytes Raw(const TypedArray& a) { return Bytes(a.raw().begin(), a.raw().end() - 1); }

// Element counts of the all-reduces: empty, the eager and direct paths (one stream), and the
// ring with a few and many messages; none a multiple of 2 or 4 where it matters (the ring's
// chunks and segments then differ in length across the streams).
std::vector<size_t> AllreduceCounts(DType dtype) {
  const size_t element = ElementSize(dtype);
  std::vector<size_t> counts = {0, 1, 1001, kDirectAllreduceMaxBytes / element + 3};
  // On 8 ranks 28 ring messages of float32 (at 1 MiB under a sanitizer, 5-15x slower: still
  // 28), more than 4 streams' 16 receive slots.
  if (dtype == DType::kFloat32) counts.push_back((kSanitizerBuild ? size_t{1} << 20 : size_t{3} << 20) / element + 7);
  return counts;
}

// Every payload path with `k` streams per peer on this rank; what each left in its buffers, in
// order. Each rank creates its communicator under its own store prefix per k.
std::vector<Bytes> RunEveryPath(int rank, int n, const std::shared_ptr<Store>& store, int k) {
  CommunicatorOptions options;
  options.streams_per_peer = k;
  auto comm = Communicator::Create(std::make_shared<PrefixStore>(absl::StrCat("k", k), store), rank, n, options);
  std::vector<Bytes> out;
  uint32_t salt = 0;
  for (DType dtype : AllDTypes()) {
    for (size_t count : AllreduceCounts(dtype)) {
      TypedArray a(dtype, count);
      FillFor(a, rank, ++salt);
      comm->allreduce(a.buffer(), IsFloatingPoint(dtype) ? ReduceOp::kAvg : ReduceOp::kSum)->wait();
      out.push_back(Raw(a));
    }
  }
  if (n > 1) {
    // Point-to-point around the ring: 1 MB + 13 floats (5 segments of 256 KiB), then the same
    // from three pieces (segments that straddle pieces are copied, the rest sent in place).
    const size_t count = (size_t{1} << 18) + 13;
    TypedArray whole(DType::kFloat32, count), received(DType::kFloat32, count), gathered(DType::kFloat32, count);
    FillFor(whole, rank, ++salt);
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    comm->p2p({P2POp::Send(whole.buffer(), right, 7), P2POp::Recv(received.buffer(), left, 7)})->wait();
    out.push_back(Raw(received));
    const size_t a = 70001, b = 100003;
    comm->p2p({P2POp::SendGather({whole.slice(0, a), whole.slice(a, b), whole.slice(a + b, count - a - b)}, right, 8),
               P2POp::Recv(gathered.buffer(), left, 8)})
        ->wait();
    out.push_back(Raw(gathered));
  }
  // A push-sum round (on one graph for every n) over point-to-point.
  TypedArray x(DType::kFloat32, kSanitizerBuild ? 300007 : 600011);  // 5 or 10 segments
  FillFor(x, rank, ++salt);
  PushSum push_sum(MakePeerGraph("exponential", n));
  push_sum.Step(*comm, {x.buffer()});
  out.push_back(Raw(x));
  const double weight = push_sum.weight();
  out.push_back(Bytes(reinterpret_cast<const uint8_t*>(&weight), reinterpret_cast<const uint8_t*>(&weight + 1)));
  // The quantized all-reduce (its scatter rounds and ring all-gather over point-to-point).
  TypedArray q(DType::kFloat32, kSanitizerBuild ? 300007 : 700001);
  FillFor(q, rank, ++salt);
  QuantizedAllreduce(*comm, q.buffer(), QuantizedAllreduceOptions{});
  out.push_back(Raw(q));
  comm->shutdown();
  return out;
}

class StreamsPerPeerTest : public ::testing::TestWithParam<std::tuple<LaunchMode, int>> {};

TEST_P(StreamsPerPeerTest, EveryPathGivesTheBitsOfOneStream) {
  const auto [mode, n] = GetParam();
  RunRanksWithStore(n, mode, [n = n](int rank, std::shared_ptr<Store> store) {
    const std::vector<Bytes> one = RunEveryPath(rank, n, store, 1);
    for (int k : {2, 4}) {
      const std::vector<Bytes> striped = RunEveryPath(rank, n, store, k);
      ASSERT_EQ(striped.size(), one.size());
      for (size_t i = 0; i < one.size(); ++i) {
        ASSERT_EQ(striped[i].size(), one[i].size()) << "result " << i;
        if (striped[i] == one[i]) continue;
        size_t at = 0;
        while (striped[i][at] == one[i][at]) ++at;
        FAIL() << "rank " << rank << " of " << n << ", streams_per_peer " << k << ": result " << i << " ("
               << one[i].size() << " bytes) differs from one stream's at byte " << at;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, StreamsPerPeerTest, ::testing::ValuesIn(RankSweep()), ModeAndRanksName);

CommunicatorOptions Striped(int k, int timeout_ms) {
  CommunicatorOptions o;
  o.streams_per_peer = k;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  o.rendezvous_timeout = std::chrono::seconds(60);  // connecting on a loaded machine: a net of its own
  return o;
}

// A safety net 10x the operation timeouts below (plus the peer check's heartbeats), not a
// speed check.
constexpr auto kPromptFailure = std::chrono::seconds(30);

void ExpectPrompt(Clock::time_point start, const std::string& what) {
  EXPECT_LT(Clock::now() - start, kPromptFailure) << CurrentTestName() << ": " << what << " was not prompt";
}

class StreamsPerPeerErrorsTest : public ::testing::TestWithParam<LaunchMode> {};

// A peer that shuts down (closing every stream) while the others start a ring all-reduce.
TEST_P(StreamsPerPeerErrorsTest, PeerThatLeavesFailsTheRingOnEveryStream) {
  RunRanks(3, GetParam(), [](Communicator& comm) {
    std::vector<float> f(size_t{1} << 20, 1.0f);
    comm.barrier()->wait();
    if (comm.rank() == 2) {
      comm.shutdown();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto start = Clock::now();
    EXPECT_THAT(ExpectThrow<CommError>([&] { comm.allreduce(CpuBuffer(f.data(), f.size()))->wait(); }),
                HasSubstr("allreduce #1"));
    ExpectPrompt(start, "the all-reduce with a departed peer");
  }, Striped(4, 3000));
}

// The ring's receives are posted on every stream and none is ever matched: the all-reduce
// times out at its deadline (no signature check, so the ring itself waits).
TEST_P(StreamsPerPeerErrorsTest, MissingPeerTimesTheRingOut) {
  RunRanksWithStore(2, GetParam(), [](int rank, std::shared_ptr<Store> store) {
    CommunicatorOptions options = Striped(4, 1000);
    options.verify_collectives = false;
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 2, options);
    std::vector<float> f(size_t{1} << 20, 1.0f);
    if (rank == 0) {
      const auto start = Clock::now();
      EXPECT_THAT(ExpectThrow<TimeoutError>([&] { comm->allreduce(CpuBuffer(f.data(), f.size()))->wait(); }),
                  AllOf(HasSubstr("allreduce #0"), HasSubstr("rank 0 of 2")));
      ExpectPrompt(start, "the all-reduce with a missing peer");
      store->set("failed", {'1'});
    } else {
      store->wait({"failed"}, std::chrono::seconds(60));  // never joins the all-reduce
    }
  });
}

// A sender that dies with most of a 64 MB payload still to write on its four streams: the
// receive fails with a PeerError naming it, not after the timeout. Processes only (a thread
// cannot die alone).
TEST(StreamsPerPeerSenderTest, SenderThatDiesMidPayloadFailsTheReceive) {
  RunRanksWithStore(2, LaunchMode::kProcesses, [](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 2, Striped(4, 20000));
    std::vector<float> f(size_t{16} << 20, 1.0f);
    comm->barrier()->wait();
    if (rank == 1) {
      comm->send(CpuBuffer(f.data(), f.size()), 0, 3);
      // The kernel closes every stream with the payload part-way. The raw system call, not
      // _exit: ThreadSanitizer's _exit sleeps 1 s (atexit_sleep_ms) while the other threads
      // run on, long enough to write the whole payload.
      syscall(SYS_exit_group, 0);
    }
    const auto start = Clock::now();
    EXPECT_THAT(ExpectThrow<CommError>([&] { comm->recv(CpuBuffer(f.data(), f.size()), 1, 3)->wait(); }),
                HasSubstr("recv 16777216 x float32 on cpu from rank 1 (tag 3) on rank 0 of 2"));
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(15)) << "the receive waited for its 20 s timeout";
  });
}

// A receive that times out part-way through its payload (the sender stopped with most of
// 256 MB unsent) leaves the caller's buffer to the caller: when the sender resumes, none of the
// rest lands there, and the sender's send fails instead of completing into abandoned memory.
// Processes only (the sender stops itself with SIGSTOP). The ranks meet through the store
// before posting (MeetThroughStore): the 10 s operation timeout, which ends the receive, bounds
// the transfer, not how far apart the ranks finished filling 256 MB.
TEST(StreamsPerPeerSenderTest, ReceiveThatTimesOutLeavesTheBufferAlone) {
  RunRanksWithStore(2, LaunchMode::kProcesses, [](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 2, Striped(4, 10000));
    std::vector<float> f(size_t{64} << 20, 1.0f);
    const size_t bytes = f.size() * sizeof(float);
    auto progress = std::make_shared<TransferProgress>();
    MeetThroughStore(*store, rank, 2, "filled");
    if (rank == 1) {
      const std::string pid = std::to_string(getpid());
      store->set("sender_pid", std::vector<char>(pid.begin(), pid.end()));
      P2POp send = P2POp::Send(CpuBuffer(f.data(), f.size()), 0, 5);
      send.progress = progress;
      auto work = comm->p2p({send});
      progress->WaitFor(size_t{8} << 20);  // the header and the first segments have left
      raise(SIGSTOP);                       // resumed by rank 0 after its receive failed
      const bool sent = [&] {
        try {
          work->wait();
          return true;
        } catch (const CommError&) {
          return false;
        }
      }();
      store->set("send_done", {sent ? 'y' : 'n'});
      EXPECT_FALSE(sent) << "the send completed into a receive that had failed";
      return;
    }
    P2POp recv = P2POp::Recv(CpuBuffer(f.data(), f.size()), 1, 5);
    recv.progress = progress;
    EXPECT_THAT(ExpectThrow<TimeoutError>([&] { comm->p2p({recv})->wait(); }), HasSubstr("recv"));
    const size_t landed = progress->bytes();
    EXPECT_GT(landed, 0u) << "the receive failed before its payload started: the case is not exercised";
    EXPECT_LT(landed, bytes);
    std::fill(f.begin(), f.end(), -7.0f);
    const std::vector<char> pid = store->get("sender_pid", std::chrono::seconds(60));
    kill(std::stoi(std::string(pid.begin(), pid.end())), SIGCONT);
    store->wait({"send_done"}, std::chrono::seconds(120));
    size_t changed = 0;
    for (float x : f) changed += x != -7.0f;
    EXPECT_EQ(changed, 0u) << "elements written into the buffer after its receive failed";
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, StreamsPerPeerErrorsTest,
                         ::testing::Values(LaunchMode::kThreads, LaunchMode::kProcesses),
                         [](const ::testing::TestParamInfo<LaunchMode>& info) { return LaunchModeName(info.param); });

TEST(StreamsPerPeerOptionTest, OutOfRangeCountsAreRejected) {
  for (int bad : {0, -1, kMaxStreamsPerPeer + 1}) {
    CommunicatorOptions options;
    options.streams_per_peer = bad;
    EXPECT_THAT(ExpectThrow<InvalidArgumentError>([&] { Communicator::Create(MakeHashStore(), 0, 1, options); }),
                HasSubstr(absl::StrCat("streams_per_peer must be in [1, ", kMaxStreamsPerPeer, "], got ", bad)));
  }
}

// Ranks with different counts would connect different meshes: every rank fails at creation,
// naming the setting and who differs.
TEST(StreamsPerPeerOptionTest, RanksThatDisagreeFailAtCreation) {
  const int streams_of[] = {4, 4, 2};
  ExpectCreateFailsOnEveryRank(
      3,
      [&](int rank) {
        CommunicatorOptions options;
        options.streams_per_peer = streams_of[rank];
        return options;
      },
      "streams_per_peer", [](int rank) {
        return std::string(rank == 2 ? "is 2 here but 4 on rank(s) 0, 1;" : "is 4 here but 2 on rank(s) 2;");
      });
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
