// comm/gloo_util.h's shutdown helpers against Gloo's behaviour they work around.
#include "comm/gloo_util.h"

#include <gloo/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using Clock = std::chrono::steady_clock;

// How many bytes of `memory` Gloo has written so far: the peer sends 0x5a bytes into zeroed
// memory, and Gloo fills a bound buffer front to back.
size_t BytesArrived(const std::vector<uint8_t>& memory) {
  const auto* data = reinterpret_cast<const volatile uint8_t*>(memory.data());
  size_t lo = 0, hi = memory.size();  // the first hi bytes are not all known to be in
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (data[mid] == 0x5a) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// One attempt at catching a 64 MB message to a bound buffer half way: rank 1 sends it, rank 0
// takes the pairs off the device thread as soon as its first bytes are in, destroys the
// buffer, and checks that nothing more lands in the buffer's memory. Returns false on rank 0
// (and rank 1 learns it through the store) when the whole message was in before the pairs
// were off: a descheduled test thread, so the attempt proves nothing either way.
bool CaughtHalfWay(int rank, const std::shared_ptr<Store>& store) {
  constexpr size_t kBytes = size_t{64} << 20;
  constexpr int kSlot = 0x7a7a;
  const GlooMeshOptions options{"127.0.0.1", "", std::chrono::seconds(5)};
  std::shared_ptr<gloo::Context> mesh = ConnectGlooMesh(store, rank, 2, options);
  auto& pair = mesh->getPair(1 - rank);
  if (rank == 1) {
    std::vector<uint8_t> message(kBytes, 0x5a);
    auto out = pair->createSendBuffer(kSlot, message.data(), message.size());
    store->wait({"registered"}, std::chrono::seconds(10));
    out->send();
    const std::vector<char> outcome = store->get("outcome", std::chrono::seconds(30));
    // Rank 0 stopped reading and then closed: the send failed, or completed into the two
    // kernels' socket buffers; either way it is over.
    try {
      out->waitSend();
    } catch (const std::exception&) {
    }
    TakePairsOffTheDeviceThread(*mesh);
    out.reset();
    DestroyPairs(*mesh);
    return outcome == std::vector<char>{'y'};
  }
  std::vector<uint8_t> memory(kBytes, 0);
  auto in = pair->createRecvBuffer(kSlot, memory.data(), memory.size());
  store->set("registered", {'1'});
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (BytesArrived(memory) == 0 && Clock::now() < deadline) std::this_thread::yield();
  TakePairsOffTheDeviceThread(*mesh);
  const size_t arrived = BytesArrived(memory);
  EXPECT_GT(arrived, 0u) << "the peer's message did not start arriving within 10 s";
  const bool half_way = arrived > 0 && arrived < kBytes;
  in.reset();
  if (half_way) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // ample for the other 64 MB to arrive
    EXPECT_EQ(BytesArrived(memory), arrived) << "Gloo kept reading into the buffer after it was taken off";
  }
  DestroyPairs(*mesh);
  store->set("outcome", {half_way ? 'y' : 'n'});
  return half_way;
}

// A bound buffer (the signature check's kind) destroyed while a peer's message to it is half
// read: Gloo's device thread would finish the read into its memory and then signal the
// destroyed buffer (tcp::Pair keeps a raw pointer to it). After TakePairsOffTheDeviceThread
// the thread must not touch the buffer's memory again, so the buffer can go. Without the call
// the bytes keep arriving (this test fails), and the completion then signals the freed buffer
// (inside Debian's uninstrumented Gloo, where ASan does not look; an optimised build can abort
// on the corrupted heap later). 64 MB over loopback takes tens of milliseconds, so the first
// attempt nearly always catches the message half way; up to five are made.
TEST(TakePairsOffTheDeviceThreadTest, NothingLandsInABoundBufferAfterwards) {
  RunRanksWithStore(2, LaunchMode::kThreads, [](int rank, std::shared_ptr<Store> store) {
    constexpr int kAttempts = 5;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      if (CaughtHalfWay(rank, std::make_shared<PrefixStore>(absl::StrCat("attempt", attempt), store))) return;
    }
    if (rank == 0) {
      ADD_FAILURE() << "the whole message was in before the pairs were off in " << kAttempts << " attempts";
    }
  });
}

// A peer that has stopped reading (its pairs are off the device thread and nothing reads
// them, as with a SIGSTOPped process) while this rank still has more queued for it than the
// two kernels' socket buffers hold: TakePairsOffTheDeviceThread's flush blocks in write(),
// and must give up after the mesh's timeout (Gloo sets the socket's send timeout) rather than
// hold shutdown forever. It must also really block, or the test proves nothing.
TEST(TakePairsOffTheDeviceThreadTest, GivesUpFlushingToAPeerThatStoppedReading) {
  RunRanksWithStore(2, LaunchMode::kThreads, [](int rank, std::shared_ptr<Store> store) {
    constexpr size_t kBytes = size_t{64} << 20;  // far more than any socket buffer here
    constexpr int kSlot = 0x7b7b;
    constexpr std::chrono::milliseconds kMeshTimeout{1000};
    const GlooMeshOptions options{"127.0.0.1", "", kMeshTimeout};
    std::shared_ptr<gloo::Context> mesh = ConnectGlooMesh(store, rank, 2, options);
    if (rank == 0) {
      TakePairsOffTheDeviceThread(*mesh);  // from here on nothing reads this rank's socket
      store->set("deaf", {'1'});
      // Closing the socket would fail the peer's write at once: stay until it is done.
      store->wait({"flushed"}, std::chrono::seconds(60));
      DestroyPairs(*mesh);
      return;
    }
    store->wait({"deaf"}, std::chrono::seconds(10));
    std::vector<uint8_t> message(kBytes, 0x5a);
    auto out = mesh->getPair(0)->createSendBuffer(kSlot, message.data(), message.size());
    out->send();  // writes what the sockets take and queues the rest in the pair
    const auto start = Clock::now();
    TakePairsOffTheDeviceThread(*mesh);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    store->set("flushed", {'1'});
    std::cout << "flush to a peer that stopped reading gave up after " << took.count() << " ms (mesh timeout "
              << kMeshTimeout.count() << " ms)" << std::endl;
    EXPECT_GE(took.count(), kMeshTimeout.count() / 2) << "the flush did not block: the test proves nothing";
    EXPECT_LT(took.count(), 10 * kMeshTimeout.count()) << "the flush held on past the mesh's timeout";
    out.reset();
    DestroyPairs(*mesh);
  });
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
