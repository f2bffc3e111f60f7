// CollectiveHandshake's staged form (comm/gloo/consistency_check.h) on its own: the header sent to
// one peer first and to the rest later, and Begin's check of that peer.
#include "comm/gloo/consistency_check.h"

#include <gloo/context.h>

#include <chrono>
#include <memory>

#include "comm/core/errors.h"
#include "comm/core/op_spec.h"
#include "comm/gloo/pair_teardown.h"
#include "comm/gloo/rendezvous.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::HasSubstr;

constexpr std::chrono::milliseconds kTimeout{5000};

OpSpec AllreduceSpec(uint64_t count) {
  OpSpec spec;
  spec.kind = OpKind::kAllreduce;
  spec.dtype = DType::kFloat32;
  spec.count = count;
  return spec;
}

// Each rank sends its header to its left neighbour only, hears from its right neighbour, and
// then goes straight to Finish without SendRemainingHeaders: Finish must send the rest itself,
// or every rank waits for headers nobody sent (a timeout). Three ranks, so that "the rest" is
// not empty; then a second check on the other parity, with SendRemainingHeaders called.
TEST(CollectiveHandshakeTest, FinishSendsTheHeadersBeginHeldBack) {
  RunRanksWithStore(3, LaunchMode::kThreads, [](int rank, std::shared_ptr<Store> store) {
    std::shared_ptr<gloo::Context> mesh = ConnectGlooMesh(store, rank, 3, {"127.0.0.1", "", kTimeout});
    CollectiveHandshake handshake(*mesh);
    const int left = (rank + 2) % 3, right = (rank + 1) % 3;
    const OpSpec spec = AllreduceSpec(1000);
    handshake.Begin(spec, {}, std::chrono::steady_clock::now() + kTimeout, left);
    EXPECT_TRUE(handshake.PeerAgrees(right));
    EXPECT_NO_THROW(handshake.Finish());

    const OpSpec next = AllreduceSpec(7);
    handshake.Begin(next, {}, std::chrono::steady_clock::now() + kTimeout, left);
    handshake.SendRemainingHeaders();
    EXPECT_TRUE(handshake.PeerAgrees(left));
    EXPECT_NO_THROW(handshake.Finish());
    auto retired = handshake.TakeRetiredBuffers();  // destroyed after the pairs (the contract)
    DestroyPairs(*mesh);
  });
}

// The peer that gets the header first must be another rank of the mesh: this rank, or one
// outside it, is an InvalidArgumentError naming the value, before anything is sent.
TEST(CollectiveHandshakeTest, BeginRejectsAFirstPeerThatIsNotAnotherRank) {
  RunRanksWithStore(2, LaunchMode::kThreads, [](int rank, std::shared_ptr<Store> store) {
    std::shared_ptr<gloo::Context> mesh = ConnectGlooMesh(store, rank, 2, {"127.0.0.1", "", kTimeout});
    CollectiveHandshake handshake(*mesh);
    const OpSpec spec = AllreduceSpec(4);
    for (int bad : {rank, 2, -2}) {
      try {
        handshake.Begin(spec, {}, std::chrono::steady_clock::now() + kTimeout, bad);
        ADD_FAILURE() << "Begin accepted " << bad << " as the first peer on rank " << rank;
      } catch (const InvalidArgumentError& e) {
        EXPECT_THAT(e.what(), HasSubstr("must be another rank, got " + std::to_string(bad)));
      }
    }
    auto retired = handshake.TakeRetiredBuffers();
    // Both ranks have connected before either closes its pairs: the other may still be
    // finishing its side of the mesh (seen once under ASan: "connecting the mesh: ...
    // Connection closed by peer").
    store->set("connected_" + std::to_string(rank), {'1'});
    store->wait({"connected_0", "connected_1"}, kTimeout);
    DestroyPairs(*mesh);
  });
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
