// Bad input and failures: each case asserts the error type, that the message names what
// was wrong and where, and that every rank returns within the timeout.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/core/store.h"
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

// Every rank that fails must return, not hang: operation timeouts here are at most 3 s, the
// peer check adds 3-4 heartbeat intervals (6 if this rank's own heartbeat stalls), so a failure
// takes at most about 4.5 s; mismatches and argument errors return in milliseconds. The bound
// is a safety net 10x the longest timeout, not a speed check: a loaded 2-core machine under
// TSan must not break it.
constexpr std::chrono::milliseconds kPromptFailure{30000};

void ExpectPrompt(Clock::time_point start, const std::string& what) {
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  EXPECT_LT(took, kPromptFailure) << CurrentTestName() << ": " << what << " took " << took.count() << " ms to fail";
}

// Waits on `work` and returns the message of the `E` it must fail with, promptly.
template <typename E>
std::string ExpectFailure(const std::shared_ptr<Work>& work) {
  const auto start = Clock::now();
  try {
    work->wait();
  } catch (const E& e) {
    ExpectPrompt(start, work->description());
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an error from " << work->description();
  return "";
}

template <typename E, typename Fn>
std::string ExpectPromptThrow(Fn fn) {
  const auto start = Clock::now();
  try {
    fn();
  } catch (const E& e) {
    ExpectPrompt(start, e.what());
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

CommunicatorOptions Quick(int timeout_ms = 2000) {
  CommunicatorOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  // Create's rendezvous gets a safety net of its own: connecting (processes, under a sanitizer,
  // on a loaded machine) can take longer than the short operation timeout under test.
  o.rendezvous_timeout = std::chrono::seconds(60);
  return o;
}

class ErrorsTest : public ::testing::TestWithParam<LaunchMode> {};

TEST_P(ErrorsTest, MismatchedElementCountsAreDetectedOnEveryRankAndCommStaysUsable) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    std::vector<float> data(comm.rank() == 2 ? 99 : 100, 1.0f);
    const auto msg = ExpectFailure<MismatchError>(comm.allreduce(CpuBuffer(data.data(), data.size())));
    EXPECT_THAT(msg, AllOf(HasSubstr("allreduce #0"), HasSubstr("element count"), HasSubstr("rank 2: 99"),
                           HasSubstr("rank 1: 100"), HasSubstr(absl::StrCat("on rank ", comm.rank()))));
    // No data moved, and the next collective works.
    EXPECT_EQ(data[0], 1.0f);
    std::vector<float> ok(10, 1.0f);
    comm.allreduce(CpuBuffer(ok.data(), ok.size()))->wait();
    EXPECT_EQ(ok[9], 4.0f);
  }, Quick());
}

TEST_P(ErrorsTest, MismatchedDtypesOpsRootsAndKindsAreNamed) {
  RunRanks(3, GetParam(), [](Communicator& comm) {
    // Same byte count, different dtype: raw Gloo would silently reinterpret.
    std::vector<int32_t> ints(8, 1);
    std::vector<float> floats(8, 1.0f);
    auto w = comm.rank() == 0 ? comm.allreduce(CpuBuffer(ints.data(), 8)) : comm.allreduce(CpuBuffer(floats.data(), 8));
    EXPECT_THAT(ExpectFailure<MismatchError>(w), AllOf(HasSubstr("dtype"), HasSubstr("rank 0: int32"),
                                                       HasSubstr("rank 1: float32")));
    w = comm.allreduce(CpuBuffer(floats.data(), 8), comm.rank() == 1 ? ReduceOp::kMax : ReduceOp::kSum);
    EXPECT_THAT(ExpectFailure<MismatchError>(w), AllOf(HasSubstr("reduce op"), HasSubstr("rank 1: max")));
    w = comm.broadcast(CpuBuffer(floats.data(), 8), comm.rank() == 2 ? 1 : 0);
    EXPECT_THAT(ExpectFailure<MismatchError>(w), AllOf(HasSubstr("root"), HasSubstr("rank 2: 1")));
    w = comm.rank() == 1 ? comm.barrier() : comm.allreduce(CpuBuffer(floats.data(), 8));
    EXPECT_THAT(ExpectFailure<MismatchError>(w), AllOf(HasSubstr("operation"), HasSubstr("rank 1: barrier")));
    std::vector<float> gathered(comm.rank() == 0 ? 3 * 4 : 3 * 8);
    w = comm.allgather(CpuBuffer(floats.data(), comm.rank() == 0 ? 4 : 8), CpuBuffer(gathered.data(), gathered.size()));
    EXPECT_THAT(ExpectFailure<MismatchError>(w), HasSubstr("input element count"));
    comm.barrier()->wait();
  }, Quick());
}

// Small collectives carry their data in the signature check (EagerCollectiveMaxBytes), large
// ones do not: ranks that disagree across that line, or on the kind of operation while some
// send eager payloads, still get a MismatchError on every rank and no overflowed receive.
TEST_P(ErrorsTest, DisagreementsAcrossTheEagerLimitAreDetected) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    const int me = comm.rank();
    const size_t eager_max = EagerCollectiveMaxBytes(comm.size()) / sizeof(float);
    std::vector<float> data(eager_max + 1, 1.0f);
    const size_t count = me == 1 ? eager_max + 1 : eager_max;  // rank 1 over the line, the others at it
    EXPECT_THAT(ExpectFailure<MismatchError>(comm.allreduce(CpuBuffer(data.data(), count))),
                AllOf(HasSubstr("element count"), HasSubstr(absl::StrCat("rank 1: ", eager_max + 1)),
                      HasSubstr(absl::StrCat("rank 0: ", eager_max))));
    EXPECT_EQ(data[0], 1.0f);
    // Rank 0 posts an alltoallv (one header per peer) while the others send eager payloads.
    std::vector<size_t> counts(4, 1);
    std::vector<float> a(4), b(4);
    auto w = me == 0 ? comm.alltoallv(CpuBuffer(a.data(), 4), counts, CpuBuffer(b.data(), 4), counts)
                     : comm.allreduce(CpuBuffer(data.data(), eager_max));
    EXPECT_THAT(ExpectFailure<MismatchError>(w), AllOf(HasSubstr("operation"), HasSubstr("rank 0: alltoallv")));
    // Both paths still work afterwards, and agree.
    for (size_t n : {eager_max, eager_max + 1}) {
      std::vector<float> v(n, static_cast<float>(me + 1));
      comm.allreduce(CpuBuffer(v.data(), n))->wait();
      EXPECT_EQ(v.front(), 10.0f);
      EXPECT_EQ(v.back(), 10.0f);
    }
  }, Quick());
}

// Above kDirectAllreduceMaxBytes the ring sends its first segments while the signature check
// is still in flight, to any neighbour whose signature matches (comm/gloo/ring_allreduce.h). A
// disagreement must still fail every rank the same way, leave every caller's buffer as it
// was, and leave no message behind that could land in a later collective: each case is
// followed by a ring all-reduce whose result is checked. 2, 3 and 4 ranks: on 2 the left and
// right neighbour are the same rank; on 4 some neighbour pairs agree and speculate.
TEST_P(ErrorsTest, RingDisagreementsFailEveryRankAndLeaveTheBuffersAlone) {
  for (int ranks : {2, 3, 4}) {
    RunRanks(ranks, GetParam(), [](Communicator& comm) {
      const int me = comm.rank();
      const int n = comm.size();
      const int odd = n - 1;  // the rank that disagrees
      const size_t ring = kDirectAllreduceMaxBytes / sizeof(float) + 5;
      std::vector<float> data(ring + 1, 1.0f);
      auto untouched = [&](const std::string& what) {
        for (size_t i = 0; i < data.size(); ++i) {
          ASSERT_EQ(data[i], 1.0f) << what << ": element " << i << " of rank " << me << " was modified";
        }
      };
      auto ring_still_works = [&](const std::string& what) {
        std::vector<float> v(ring, static_cast<float>(me + 1));
        comm.allreduce(CpuBuffer(v.data(), v.size()))->wait();
        const float want = static_cast<float>(n * (n + 1) / 2);
        for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], want) << "after " << what << ": element " << i;
      };

      // Element count, one element apart: every chunk boundary on the odd rank shifts.
      auto w = comm.allreduce(CpuBuffer(data.data(), me == odd ? ring + 1 : ring));
      EXPECT_THAT(ExpectFailure<MismatchError>(w),
                  AllOf(HasSubstr("element count"), HasSubstr(absl::StrCat("rank ", odd, ": ", ring + 1)),
                        HasSubstr(absl::StrCat("rank 0: ", ring))));
      untouched("count");
      ring_still_works("count");

      // Across the direct line: the odd rank takes the direct path, the others the ring.
      const size_t direct = kDirectAllreduceMaxBytes / sizeof(float);
      w = comm.allreduce(CpuBuffer(data.data(), me == odd ? direct : ring));
      EXPECT_THAT(ExpectFailure<MismatchError>(w), HasSubstr("element count"));
      untouched("direct vs ring");
      ring_still_works("direct vs ring");

      // Same width, different dtype: raw Gloo would reduce the bits as the wrong type.
      std::vector<int32_t> ints(ring, 1);
      w = me == odd ? comm.allreduce(CpuBuffer(ints.data(), ring)) : comm.allreduce(CpuBuffer(data.data(), ring));
      EXPECT_THAT(ExpectFailure<MismatchError>(w), AllOf(HasSubstr("dtype"), HasSubstr(absl::StrCat("rank ", odd, ": int32"))));
      untouched("dtype");
      for (int32_t v : ints) ASSERT_EQ(v, 1);

      // Reduce op, then the operation itself (a broadcast of the same size).
      w = comm.allreduce(CpuBuffer(data.data(), ring), me == odd ? ReduceOp::kMax : ReduceOp::kSum);
      EXPECT_THAT(ExpectFailure<MismatchError>(w), AllOf(HasSubstr("reduce op"), HasSubstr(absl::StrCat("rank ", odd, ": max"))));
      w = me == odd ? comm.broadcast(CpuBuffer(data.data(), ring), 0) : comm.allreduce(CpuBuffer(data.data(), ring));
      EXPECT_THAT(ExpectFailure<MismatchError>(w), AllOf(HasSubstr("operation"), HasSubstr(absl::StrCat("rank ", odd, ": broadcast"))));
      untouched("op and kind");
      ring_still_works("op and kind");
    }, Quick());
  }
}

// verify_collectives = false drops the cross-rank check for collectives above the eager line
// (docs/comm.md: a disagreement is then the caller's to avoid, as in raw Gloo). Eager ones
// carry their data in the check's exchange, so they are checked either way. A dtype
// disagreement of equal width is the one that can be shown going through unnoticed without
// risking memory: every rank moves the same bytes.
TEST_P(ErrorsTest, WithVerificationOffOnlyEagerCollectivesAreChecked) {
  CommunicatorOptions unchecked = Quick();
  unchecked.verify_collectives = false;
  RunRanks(3, GetParam(), [](Communicator& comm) {
    const int me = comm.rank();
    const size_t big = EagerCollectiveMaxBytes(comm.size()) / sizeof(float) + 1;
    std::vector<float> v(big, static_cast<float>(me + 1));
    comm.allreduce(CpuBuffer(v.data(), big))->wait();
    EXPECT_EQ(v.front(), 6.0f);
    EXPECT_EQ(v.back(), 6.0f);
    // Rank 0 says int32, the others float32: not detected above the eager line...
    std::vector<float> f(big, 1.0f);
    std::vector<int32_t> i(big, 1);
    auto w = me == 0 ? comm.allreduce(CpuBuffer(i.data(), big)) : comm.allreduce(CpuBuffer(f.data(), big));
    w->wait();
    // ...but still below it.
    auto eager = me == 0 ? comm.allreduce(CpuBuffer(i.data(), 4)) : comm.allreduce(CpuBuffer(f.data(), 4));
    EXPECT_THAT(ExpectFailure<MismatchError>(eager), AllOf(HasSubstr("dtype"), HasSubstr("rank 0: int32")));
    // The unchecked path still agrees afterwards.
    std::fill(v.begin(), v.end(), static_cast<float>(me + 1));
    comm.allreduce(CpuBuffer(v.data(), big))->wait();
    EXPECT_EQ(v.back(), 6.0f);
  }, unchecked);
}

TEST_P(ErrorsTest, AllgathervAndAlltoallvCountDisagreements) {
  RunRanks(3, GetParam(), [](Communicator& comm) {
    const int me = comm.rank();
    std::vector<size_t> counts = {1, 2, 3};
    if (me == 1) counts = {2, 2, 2};
    std::vector<float> in(counts[me]), out(6);
    EXPECT_THAT(ExpectFailure<MismatchError>(comm.allgatherv(CpuBuffer(in.data(), in.size()), CpuBuffer(out.data(), 6), counts)),
                HasSubstr("counts"));
    // Rank 0 sends 2 to rank 2, but rank 2 expects 1 from rank 0: every rank (also rank 1) fails.
    std::vector<size_t> send = {1, 1, 1}, recv = {1, 1, 1};
    if (me == 0) send = {1, 1, 2};
    std::vector<float> a(4), b(3);
    const auto msg = ExpectFailure<MismatchError>(
        comm.alltoallv(CpuBuffer(a.data(), me == 0 ? 4 : 3), send, CpuBuffer(b.data(), 3), recv));
    EXPECT_THAT(msg, HasSubstr("rank 0 sends 2 elements to rank 2 but rank 2 expects 1"));
  }, Quick());
}

TEST_P(ErrorsTest, PointToPointSizeAndDtypeMismatch) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    std::vector<float> big(12, 7.0f), small(10, 0.0f);
    if (comm.rank() == 0) {
      comm.send(CpuBuffer(big.data(), 12), 1, 3)->wait();  // the sender's part succeeds
      comm.send(CpuBuffer(big.data(), 5), 1, 4)->wait();
      std::vector<int32_t> ints(10, 1);
      comm.send(CpuBuffer(ints.data(), 10), 1, 5)->wait();
    } else {
      // Longer than the buffer: raw Gloo would abort the process.
      EXPECT_THAT(ExpectFailure<MismatchError>(comm.recv(CpuBuffer(small.data(), 10), 0, 3)),
                  AllOf(HasSubstr("expected 10 x float32"), HasSubstr("rank 0 sent 12 x float32"), HasSubstr("tag 3")));
      EXPECT_EQ(small[0], 0.0f) << "buffer must be untouched";
      // Shorter than the buffer: raw Gloo would report success.
      EXPECT_THAT(ExpectFailure<MismatchError>(comm.recv(CpuBuffer(small.data(), 10), 0, 4)),
                  HasSubstr("sent 5 x float32"));
      EXPECT_THAT(ExpectFailure<MismatchError>(comm.recv(CpuBuffer(small.data(), 10), 0, 5)),
                  HasSubstr("sent 10 x int32"));
    }
    comm.barrier()->wait();
  }, Quick());
}

TEST_P(ErrorsTest, InvalidArgumentsRaiseSynchronously) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    std::vector<float> f(4);
    std::vector<int32_t> ints(4);
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] { comm.send(CpuBuffer(f.data(), 4), 2); }),
                AllOf(HasSubstr("peer 2 is out of range [0, 2)"), HasSubstr("rank")));
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] { comm.recv(CpuBuffer(f.data(), 4), -1); }),
                HasSubstr("peer -1 is out of range"));
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] { comm.send(CpuBuffer(f.data(), 4), comm.rank()); }),
                HasSubstr("this rank itself"));
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] { comm.broadcast(CpuBuffer(f.data(), 4), 7); }),
                HasSubstr("root 7 is out of range"));
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] { comm.allreduce(CpuBuffer(ints.data(), 4), ReduceOp::kAvg); }),
                HasSubstr("avg is not supported for integer dtype int32"));
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] {
                  comm.allreduce(Buffer{nullptr, 4, DType::kFloat32, Device::CPU()});
                }),
                HasSubstr("null but has 4 elements"));
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] { comm.allgather(CpuBuffer(f.data(), 4), CpuBuffer(f.data(), 4)); }),
                HasSubstr("output has 4 elements but size() * input.count = 2 * 4 = 8"));
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] {
                  comm.reduce_scatter(CpuBuffer(f.data(), 4), CpuBuffer(ints.data(), 2));
                }),
                HasSubstr("input is float32 but output is int32"));
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] {
                  comm.allgatherv(CpuBuffer(f.data(), 1), CpuBuffer(f.data(), 2), {1});
                }),
                HasSubstr("one per rank (2)"));
    EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] {
                  comm.allreduce(Buffer{f.data(), 4, DType::kFloat32, Device::CUDA(0)});
                }),
                HasSubstr("cuda:0"));
    // Nothing above was queued: the group is still in step.
    comm.allreduce(CpuBuffer(f.data(), 4))->wait();
  }, Quick());
}

// The silent peer stays connected until rank 0 has failed (a store key, not a sleep, which a
// loaded machine can outlast: its leaving would end the wait with a closed connection instead).
TEST_P(ErrorsTest, MissingPeerTimesOutPromptlyThenCommIsAborted) {
  RunRanksWithStore(2, GetParam(), [](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 2, Quick(1000));
    std::vector<float> f(4, 1.0f);
    if (rank == 0) {
      const auto start = Clock::now();
      const auto msg = ExpectFailure<TimeoutError>(comm->allreduce(CpuBuffer(f.data(), 4)));
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      store->set("failed", {'1'});
      EXPECT_LT(took.count(), 10000) << CurrentTestName() << ": took " << took.count() << " ms (timeout 1000 ms)";
      EXPECT_THAT(msg, AllOf(HasSubstr("allreduce #0"), HasSubstr("rank 0 of 2")));
      EXPECT_THAT(ExpectPromptThrow<AbortedError>([&] { comm->allreduce(CpuBuffer(f.data(), 4)); }),
                  HasSubstr("earlier failure"));
    } else {
      store->wait({"failed"}, std::chrono::seconds(60));  // never joins the collective
    }
  });
}

// As above: the silent peer stays until rank 0 has failed.
TEST_P(ErrorsTest, ReceiveFromSilentPeerTimesOutAndAbortsTheCommunicator) {
  RunRanksWithStore(2, GetParam(), [](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 2, Quick(800));
    std::vector<float> f(4, 1.0f);
    if (rank == 0) {
      const auto start = Clock::now();
      EXPECT_THAT(ExpectFailure<TimeoutError>(comm->recv(CpuBuffer(f.data(), 4), 1, 42)),
                  AllOf(HasSubstr("recv 4 x float32 on cpu from rank 1 (tag 42) on rank 0 of 2: timed out")));
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      store->set("failed", {'1'});
      EXPECT_LT(took.count(), 8000) << CurrentTestName() << ": took " << took.count() << " ms (timeout 800 ms)";
      // The p2p stream is out of step after a timeout: later calls fail fast.
      EXPECT_THAT(ExpectPromptThrow<AbortedError>([&] { comm->send(CpuBuffer(f.data(), 4), 1, 0); }),
                  HasSubstr("earlier failure"));
    } else {
      store->wait({"failed"}, std::chrono::seconds(60));  // never sends
    }
  });
}

TEST_P(ErrorsTest, PeerThatLeavesIsReportedNotWaitedFor) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    std::vector<float> f(1 << 16, 1.0f);
    comm.barrier()->wait();
    if (comm.rank() == 1) {
      comm.shutdown();  // closes its connections, as a crashed peer's kernel would
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto start = Clock::now();
    try {
      comm.allreduce(CpuBuffer(f.data(), f.size()))->wait();
      ADD_FAILURE() << "allreduce with a departed peer succeeded";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("allreduce #1"));
    }
    // A safety net 10x the timeout: a departed peer must not be waited for indefinitely.
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    EXPECT_LT(took.count(), 30000) << CurrentTestName() << ": took " << took.count() << " ms (timeout 3000 ms)";
  }, Quick(3000));
}

TEST_P(ErrorsTest, WaitWithShortTimeoutAndCallsAfterShutdown) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    std::vector<float> f(4, 1.0f);
    if (comm.rank() == 0) {
      auto w = comm.recv(CpuBuffer(f.data(), 4), 1, 0);
      EXPECT_FALSE(w->is_completed());
      EXPECT_THAT(ExpectPromptThrow<TimeoutError>([&] { w->wait(std::chrono::milliseconds(50)); }),
                  HasSubstr("wait timed out after 50 ms"));
      comm.barrier()->wait();  // now rank 1 sends
      w->wait();
      EXPECT_TRUE(w->is_completed());
    } else {
      comm.barrier()->wait();
      comm.send(CpuBuffer(f.data(), 4), 0, 0)->wait();
    }
    comm.barrier()->wait();
    comm.shutdown();
    comm.shutdown();  // idempotent
    EXPECT_THAT(ExpectPromptThrow<AbortedError>([&] { comm.allreduce(CpuBuffer(f.data(), 4)); }), HasSubstr("shut down"));
    EXPECT_THAT(ExpectPromptThrow<AbortedError>([&] { comm.send(CpuBuffer(f.data(), 4), 1 - comm.rank()); }),
                HasSubstr("shut down"));
  }, Quick());
}

// Only an untimed wait() runs a collective on the waiting thread: a timed one returns at its
// own timeout while the collective (here waiting for a late peer) keeps going, and completes.
// Rank 1 joins only once rank 0's timed wait has returned (a store key, not a sleep, which a
// loaded machine can outlast).
TEST_P(ErrorsTest, TimedWaitOnAPendingCollectiveReturnsAtItsTimeout) {
  RunRanksWithStore(2, GetParam(), [](int rank, std::shared_ptr<Store> store) {
    // The collective's own timeout is 20 s, far from the timed wait's 50 ms, so the bound below
    // can be a safety net (100x the wait) that still tells the two apart.
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 2, Quick(20000));
    std::vector<float> f(4, static_cast<float>(rank + 1));
    if (rank == 0) {
      auto w = comm->allreduce(CpuBuffer(f.data(), 4));
      const auto start = Clock::now();
      EXPECT_THAT(ExpectPromptThrow<TimeoutError>([&] { w->wait(std::chrono::milliseconds(50)); }),
                  HasSubstr("wait timed out after 50 ms"));
      // The timed wait did not run the collective inline (that would wait for rank 1, which
      // joins only after this, until the collective's 20 s timeout): it returned at its own
      // 50 ms. The bound is 100x that and 4x under the collective's timeout.
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      EXPECT_LT(took.count(), 5000) << CurrentTestName() << ": a 50 ms wait took " << took.count()
                                    << " ms (the collective's timeout is 20000 ms)";
      store->set("waited", {'1'});
      w->wait();
    } else {
      store->wait({"waited"}, std::chrono::seconds(60));
      comm->allreduce(CpuBuffer(f.data(), 4))->wait();
    }
    EXPECT_EQ(f[3], 3.0f);
  });
}

// A collective's deadline counts from its issue, not from its start: B, queued behind A (one
// lane) while a late peer holds A up for 2.8 s, gets only what is left of its 4 s timeout for
// its data exchange and fails about 4 s after its issue (plus the peer check), not 4 s after it
// started (6.8 s). No signature check (verify_collectives off, and 1 MiB is above the eager
// limit): the data exchange's own waits (issue_time_test covers the check's).
TEST_P(ErrorsTest, QueuedCollectiveGetsWhatIsLeftOfItsTimeout) {
  CommunicatorOptions options = Quick(4000);
  options.collective_lanes = 1;
  options.verify_collectives = false;
  options.heartbeat_interval = std::chrono::milliseconds(50);  // peer check: 150-300 ms
  RunRanksWithStore(2, GetParam(), [options](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(store, rank, 2, options);
    std::vector<float> a(1 << 18, 1.0f), b(1 << 18, 1.0f);  // 1 MiB each
    if (rank == 0) {
      const auto issued = Clock::now();
      auto first = comm->allreduce(CpuBuffer(a.data(), a.size()));
      auto second = comm->allreduce(CpuBuffer(b.data(), b.size()));  // rank 1 never issues it
      first->wait();
      EXPECT_THAT(ExpectFailure<TimeoutError>(second), AllOf(HasSubstr("allreduce #1"), HasSubstr("rank 0 of 2")));
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - issued);
      // Expected ~4.2 s; with its timeout counted from its start it took ~7 s.
      // The bound tells the two apart (1.3 s from each); only the peer check (150-300 ms) and
      // the error path take longer on a slower machine: A's completion, which a slower machine
      // delays, does not move B's deadline.
      EXPECT_LT(took.count(), 5500) << CurrentTestName() << ": the queued collective failed " << took.count()
                                    << " ms after issue: it outlived its timeout of 4000 ms from issue";
      store->set("failed", {'1'});
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2800));
      comm->allreduce(CpuBuffer(a.data(), a.size()))->wait();
      store->wait({"failed"}, std::chrono::seconds(60));  // stays up until rank 0 has failed
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, ErrorsTest, ::testing::ValuesIn(LaunchModes()),
                         [](const ::testing::TestParamInfo<LaunchMode>& info) { return LaunchModeName(info.param); });

// rendezvous_timeout bounds the rendezvous, not the (shorter) operation timeout: a rank that
// starts 3 s late still joins ranks whose operations time out after 1 s.
TEST(CreateTest, RendezvousWaitsItsOwnTimeForALateRank) {
  RunRanksWithStore(2, LaunchMode::kThreads, [](int rank, std::shared_ptr<Store> store) {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
    CommunicatorOptions o;
    o.timeout = std::chrono::seconds(1);
    o.rendezvous_timeout = std::chrono::seconds(60);
    auto comm = Communicator::Create(store, rank, 2, o);
    std::vector<float> x(4, 1.0f);
    comm->allreduce(CpuBuffer(x.data(), x.size()))->wait();
    EXPECT_EQ(x[0], 2.0f);
  });
}

TEST(CreateTest, RejectsBadArgumentsAndTimesOutWhenRanksAreMissing) {
  EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([] { Communicator::Create(MakeHashStore(), 3, 2); }),
              HasSubstr("rank 3 is out of range [0, 2)"));
  EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([] { Communicator::Create(MakeHashStore(), 0, 0); }),
              HasSubstr("size must be >= 1"));
  CommunicatorOptions negative_rendezvous;
  negative_rendezvous.rendezvous_timeout = std::chrono::milliseconds(-1);
  EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>(
                  [&] { Communicator::Create(MakeHashStore(), 0, 1, negative_rendezvous); }),
              HasSubstr("rendezvous_timeout must be >= 0"));
  EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([] { Communicator::Create(nullptr, 0, 1); }), HasSubstr("store"));
  CommunicatorOptions bad_device;
  bad_device.cuda_device = -2;
  EXPECT_THAT(ExpectPromptThrow<InvalidArgumentError>([&] { Communicator::Create(MakeHashStore(), 0, 1, bad_device); }),
              HasSubstr("cuda_device must be a CUDA device ordinal, or -1"));
  // A rank that never comes: Create fails at the rendezvous time (here the timeout itself).
  CommunicatorOptions short_rendezvous;
  short_rendezvous.timeout = std::chrono::milliseconds(500);
  const auto start = Clock::now();
  EXPECT_THAT(ExpectPromptThrow<TimeoutError>([&] { Communicator::Create(MakeHashStore(), 0, 2, short_rendezvous); }),
              AllOf(HasSubstr("rank 0 of 2"), HasSubstr("rendezvous")));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  EXPECT_LT(took.count(), 5000) << CurrentTestName() << ": a rendezvous with a 500 ms timeout took " << took.count()
                                << " ms to fail";
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
