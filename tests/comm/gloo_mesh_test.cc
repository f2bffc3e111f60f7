// comm/gloo/pair_teardown.h and comm/gloo/rendezvous.h against the Gloo behaviour they work
// around: the shutdown helpers, and the rendezvous deadline of ConnectGlooMesh.
#include "comm/gloo/pair_teardown.h"
#include "comm/gloo/rendezvous.h"

#include <gloo/context.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"
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

// A store whose long waits for a missing key (Gloo's, bounded by the mesh's timeout) block past
// that timeout, until Release(): Gloo's rendezvous thread is then still in the store at the
// deadline. With `serialise`, the client also serialises its calls (as torch's TCPStore does), so
// while Gloo's call blocks no probe of the same store can be answered; without it, short waits
// (the diagnosis's 1 ms probes) are answered at once. With `fail_probe`, the diagnosis's first
// call (a set of "deadline_probe_<rank>") fails, as on a store whose host has gone.
class BlockingStore : public Store {
 public:
  BlockingStore(bool serialise, bool fail_probe = false) : serialise_(serialise), fail_probe_(fail_probe) {}
  void set(const std::string& key, const std::vector<char>& value) override {
    auto client = Client();
    if (fail_probe_ && absl::StartsWith(key, "deadline_probe_")) throw PeerError("store: connection reset by peer");
    inner_->set(key, value);
  }
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto client = Client();
    BlockIfMissing({key}, timeout);
    return inner_->get(key, timeout);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    auto client = Client();
    BlockIfMissing(keys, timeout);
    inner_->wait(keys, timeout);
  }
  // Lets the blocked calls go on (they then fail as the inner store's would) and waits until no
  // call of Gloo's thread or the probe's holds the client.
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> client(client_);
  }

 private:
  std::unique_lock<std::mutex> Client() {
    return serialise_ ? std::unique_lock<std::mutex>(client_) : std::unique_lock<std::mutex>();
  }
  void BlockIfMissing(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    if (timeout < std::chrono::milliseconds(100)) return;
    try {
      inner_->wait(keys, std::chrono::milliseconds(0));
    } catch (const TimeoutError&) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(120), [&] { return released_; });
    }
  }
  const bool serialise_, fail_probe_;
  std::shared_ptr<Store> inner_ = MakeHashStore();
  std::mutex client_;  // held through each call when serialising, as TCPStore's client lock
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

// Rank 0 of `size` connects through `store` with a 1000 ms timeout while the other ranks never
// connect: the rendezvous must fail with a TimeoutError whose message holds every one of
// `needles`, well within its timeout (a safety net only: 20x). Prints how long it took.
void ExpectRendezvousTimeout(const std::string& name, std::shared_ptr<Store> store, int size,
                             const std::vector<std::string>& needles) {
  constexpr std::chrono::milliseconds kTimeout{1000};
  const GlooMeshOptions options{"127.0.0.1", "", kTimeout};
  const auto start = Clock::now();
  try {
    ConnectGlooMesh(std::move(store), 0, size, options);
    ADD_FAILURE() << name << ": a mesh of " << size << " connected with rank 0 alone";
  } catch (const TimeoutError& e) {
    for (const std::string& needle : needles) EXPECT_TRUE(absl::StrContains(e.what(), needle)) << e.what();
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  std::cout << name << ": failed after " << took.count() << " ms (timeout " << kTimeout.count() << " ms)" << std::endl;
  EXPECT_LT(took, 20 * kTimeout) << name << ": the rendezvous outlived its timeout";
}

// The rendezvous deadline (ConnectGlooMesh): a rank that never arrives fails the others at the
// mesh's timeout (here Gloo's own store wait, bounded by it, fails first and names the key).
TEST(ConnectGlooMeshTest, ARankThatNeverArrivesFailsTheOthersAtTheDeadline) {
  ExpectRendezvousTimeout("a rank never arrives", MakeHashStore(), 3,
                          {"rank 0 of 3: rendezvous did not complete within 1000 ms"});
}

// Gloo's thread is still blocked in the store at the deadline, and the store answers probes:
// the error comes at the deadline (timeout + 100 ms of slack) and names the ranks whose address
// is not in the store, in either key form (Debian's Gloo's "<r>", torch's Gloo's "rank_<r>").
TEST(ConnectGlooMeshTest, TheRanksThatNeverPublishedAreNamed) {
  auto store = std::make_shared<BlockingStore>(/*serialise=*/false);
  store->set("2", {'x'});       // rank 2 published with Debian's Gloo's key,
  store->set("rank_3", {'x'});  // rank 3 with torch's Gloo's; rank 1 did not (Gloo waits for it first)
  ExpectRendezvousTimeout("ranks never published", store, 4,
                          {"rank 0 of 4: rendezvous did not complete within 1000 ms",
                           "rank(s) 1 never published an address"});
  store->Release();
}

// The diagnosis after a missed deadline asks the store why; when the store does not answer (its
// client is held by Gloo's blocked call), the error must still come at the deadline plus the
// probe's bound (timeout + max(timeout / 10, 250 ms)), saying that the store did not answer,
// not when the store lets go (here: only at Release, after the check).
TEST(ConnectGlooMeshTest, AStoreThatDoesNotAnswerTheProbeDoesNotHoldTheError) {
  auto store = std::make_shared<BlockingStore>(/*serialise=*/true);
  ExpectRendezvousTimeout("a store that does not answer the probe", store, 2,
                          {"rank 0 of 2: rendezvous did not complete within 1000 ms",
                           "the rendezvous store did not answer a probe within 250 ms more"});
  store->Release();  // Gloo's thread and the probe's end now
}

// A store that fails the probe (its host gone, as when env://'s rank 0 has exited): the error
// says the store is unreachable, with the store's own error.
TEST(ConnectGlooMeshTest, AnUnreachableStoreIsNamed) {
  auto store = std::make_shared<BlockingStore>(/*serialise=*/false, /*fail_probe=*/true);
  ExpectRendezvousTimeout("an unreachable store", store, 2,
                          {"rank 0 of 2: rendezvous did not complete within 1000 ms, and the rendezvous store is "
                           "now unreachable",
                           "connection reset by peer"});
  store->Release();
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
