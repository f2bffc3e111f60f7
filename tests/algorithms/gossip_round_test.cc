// The fused gossip round (algorithms/gossip_round.h) on large CPU rounds, which FinishRound
// mixes while they are still in flight: results equal a locally computed reference for every
// dtype, one and two in-peers, several buffers; and a round whose message stops half way
// puts back what it had mixed, so that a failed round modifies nothing.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms/elementwise.h"
#include "algorithms/gossip_round.h"
#include "comm/core/errors.h"
#include "comm/core/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::HasSubstr;
using gossip_internal::Elem;
using gossip_internal::FinishRound;
using gossip_internal::RoundSpec;
using gossip_internal::StartRound;

// Small integers: with coefficients 1/2 and 1/4 every result is exact in every dtype.
double IntValue(int rank, size_t i) { return static_cast<double>(((rank * 37 + static_cast<int>(i % 9973) * 11) % 17) - 8); }

// Three buffers whose boundaries fall inside the parts FinishRound mixes at a time.
const std::vector<size_t> kCounts = {(size_t{1} << 19) + 5, 3, (size_t{1} << 19) + 777};

template <DType D>
void CheckLargeRound(int in_peers, LaunchMode mode) {
  using E = Elem<D>;
  using S = typename E::Storage;
  RunRanks(3, mode, [&](Communicator& comm) {
    const int n = comm.size(), me = comm.rank();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    auto value = [&](int rank, size_t i) { return E::Store(static_cast<typename E::Compute>(IntValue(rank, i))); };
    std::vector<std::vector<S>> x(kCounts.size());
    std::vector<Buffer> buffers;
    size_t at = 0;
    for (size_t k = 0; k < kCounts.size(); ++k) {
      x[k].resize(kCounts[k]);
      for (size_t i = 0; i < kCounts[k]; ++i) x[k][i] = value(me, at + i);
      buffers.push_back(Buffer{x[k].data(), kCounts[k], D, Device::CPU()});
      at += kCounts[k];
    }
    RoundSpec spec;
    spec.algorithm = "gossip_round_test";
    spec.step = 7;
    spec.tag = 3;
    spec.send_in_place = true;
    spec.with_weight = true;
    spec.weight = 1.0 + me;
    std::vector<double> recv_coef;
    if (in_peers == 1) {
      spec.send_to = {next};
      spec.send_scale = {0.5};
      spec.recv_from = {prev};
      recv_coef = {1.0};
    } else {
      spec.send_to = {next, prev};
      spec.send_scale = {0.25, 0.25};
      spec.recv_from = {prev, next};
      recv_coef = {1.0, 1.0};
    }
    // Rank 0 waits in FinishRound before anything has arrived, so it mixes while in flight.
    if (me != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto round = StartRound(comm, buffers, spec);
    double weight = spec.weight;
    FinishRound(*round, buffers, 0.5, recv_coef, &weight);
    EXPECT_LE(round->elements_mixed_in_flight(), at);
    if (me == 0) {
      std::printf("rank 0 (%s, %d in-peer(s)): %zu of %zu elements mixed in flight\n", DTypeName(D), in_peers,
                  round->elements_mixed_in_flight(), at);
    }
    at = 0;
    for (size_t k = 0; k < kCounts.size(); ++k) {
      for (size_t i = 0; i < kCounts[k]; ++i, ++at) {
        const double expected = in_peers == 1
                                    ? 0.5 * IntValue(me, at) + 0.5 * IntValue(prev, at)
                                    : 0.5 * IntValue(me, at) + 0.25 * IntValue(prev, at) + 0.25 * IntValue(next, at);
        ASSERT_EQ(static_cast<double>(E::Load(x[k][i])), expected)
            << "rank " << me << " buffer " << k << " element " << i << " (" << DTypeName(D) << ")";
      }
    }
    const double expected_weight =
        in_peers == 1 ? 0.5 * (1.0 + me) + 0.5 * (1.0 + prev) : 0.5 * (1.0 + me) + 0.25 * (2.0 + prev + next);
    EXPECT_EQ(weight, expected_weight);
  });
}

class LargeRoundTest : public ::testing::TestWithParam<std::tuple<LaunchMode, int>> {};

TEST_P(LargeRoundTest, EqualsTheReferenceInEveryDtype) {
  const LaunchMode mode = std::get<0>(GetParam());
  const int in_peers = std::get<1>(GetParam());
  CheckLargeRound<DType::kFloat32>(in_peers, mode);
  CheckLargeRound<DType::kFloat64>(in_peers, mode);
  CheckLargeRound<DType::kFloat16>(in_peers, mode);
  CheckLargeRound<DType::kBFloat16>(in_peers, mode);
}

INSTANTIATE_TEST_SUITE_P(Modes, LargeRoundTest,
                         ::testing::Combine(::testing::ValuesIn(LaunchModes()),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return LaunchModeName(std::get<0>(info.param)) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "InPeers";
                         });

// A large round between ranks at different steps: the step is checked as soon as the
// headers land, before anything is mixed, and both ranks fail naming the steps with their
// buffers as they were.
TEST(FailedRoundTest, AStepMismatchIsCaughtBeforeAnythingIsMixed) {
  constexpr size_t kCount = size_t{1} << 20;  // float32: 4 MB
  RunRanks(2, LaunchMode::kThreads, [&](Communicator& comm) {
    const int me = comm.rank(), peer = 1 - me;
    std::vector<float> x(kCount), before(kCount);
    for (size_t i = 0; i < kCount; ++i) x[i] = before[i] = static_cast<float>(IntValue(me, i));
    const std::vector<Buffer> buffers = {CpuBuffer(x.data(), kCount)};
    RoundSpec spec;
    spec.algorithm = "gossip_round_test";
    spec.step = 7 + me;
    spec.send_in_place = true;
    spec.send_to = {peer};
    spec.send_scale = {0.5};
    spec.recv_from = {peer};
    if (me == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 waits in FinishRound
    auto round = StartRound(comm, buffers, spec);
    try {
      FinishRound(*round, buffers, 0.5, {1.0}, nullptr);
      ADD_FAILURE() << "rank " << me << ": the round should have failed";
    } catch (const MismatchError& e) {
      EXPECT_THAT(e.what(), HasSubstr(absl::StrCat("sent at its step ", 7 + peer, " but this rank is at step ", 7 + me)));
    }
    EXPECT_EQ(round->elements_mixed_in_flight(), 0u) << "rank " << me << " mixed before checking the step";
    EXPECT_EQ(std::memcmp(x.data(), before.data(), kCount * sizeof(float)), 0) << "rank " << me;
  });
}

// Rank 1 sends a 4 MB message from memory whose page at 2 MB cannot be read: its socket
// write stops there with EFAULT (a peer that fails with half of its message sent). Rank 0 has
// by then mixed the part that landed; its round fails, and its buffer must be exactly as it
// was. Where rank 1's failure surfaces depends on timing: Gloo writes from the calling thread
// when rank 0's receive is already announced (StartRound throws), else from its device thread
// (an uncaught gloo::IoException there ends the process), or the wait on the send reports it
// (FinishRound throws). Each is the planned failure, so rank 1 accepts all three; rank 0's
// checks are what the test is about.
TEST(FailedRoundTest, PutsBackWhatItMixedInFlight) {
  constexpr size_t kCount = size_t{1} << 20;  // float32: 4 MB
  CommunicatorOptions options;
  options.timeout = std::chrono::seconds(5);
  RunRanksWithStore(2, LaunchMode::kProcesses, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = Communicator::Create(std::make_shared<PrefixStore>("comm", store), rank, 2, options);
    RoundSpec spec;
    spec.algorithm = "gossip_round_test";
    spec.step = 1;
    spec.send_in_place = true;
    if (rank == 0) {
      std::vector<float> x(kCount), before(kCount);
      for (size_t i = 0; i < kCount; ++i) x[i] = before[i] = static_cast<float>(IntValue(0, i));
      const std::vector<Buffer> buffers = {CpuBuffer(x.data(), kCount)};
      spec.recv_from = {1};
      // Rank 1 sends only after this, so that rank 0 is waiting in FinishRound before the first
      // byte comes (else the failure could end the round before anything was mixed).
      store->set("receiving", {'1'});
      auto round = StartRound(*comm, buffers, spec);
      try {
        FinishRound(*round, buffers, 0.5, {1.0}, nullptr);
        ADD_FAILURE() << "the round should have failed";
      } catch (const CommError& e) {
        std::printf("rank 0: %zu elements mixed in flight, then: %s\n", round->elements_mixed_in_flight(), e.what());
      }
      EXPECT_GT(round->elements_mixed_in_flight(), 0u) << "the landed part was not mixed before the failure";
      EXPECT_LT(round->elements_mixed_in_flight(), kCount);
      EXPECT_EQ(std::memcmp(x.data(), before.data(), kCount * sizeof(float)), 0)
          << "a failed round must leave the buffer as it was";
    } else {
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      const size_t bytes = kCount * sizeof(float);
      void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(memory, MAP_FAILED);
      float* x = static_cast<float*>(memory);
      for (size_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(IntValue(1, i));
      ASSERT_EQ(mprotect(static_cast<char*>(memory) + bytes / 2, page, PROT_NONE), 0);
      spec.send_to = {0};
      spec.send_scale = {0.5};
      // The uncaught gloo::IoException on Gloo's device thread is one form of the planned
      // failure: exit 0 so that the harness does not count it as this rank failing.
      std::set_terminate([] {
        std::fprintf(stderr, "rank 1: Gloo's device thread ended at the unreadable page, as planned\n");
        _exit(0);
      });
      // Rank 0 goes from its announcement to waiting in FinishRound with nothing in between but
      // posting its receive (well under a millisecond): 300 ms is hundreds of times that, on a
      // loaded machine too.
      store->wait({"receiving"}, std::chrono::seconds(60));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const std::vector<Buffer> buffers = {CpuBuffer(x, kCount)};
      try {
        auto round = StartRound(*comm, buffers, spec);
        FinishRound(*round, buffers, 1.0, {}, nullptr);
        ADD_FAILURE() << "rank 1: the send from an unreadable page succeeded";
      } catch (const CommError& e) {
        std::fprintf(stderr, "rank 1: the round failed at the unreadable page, as planned: %s\n", e.what());
      }
      comm.reset();  // before the memory goes: nothing may still read it
      munmap(memory, bytes);
    }
  });
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
