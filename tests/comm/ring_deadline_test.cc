// The ring all-reduce ends at its deadline when its peers are not running the same collective
// the same way: here rank 0 runs the signature check (overlapped with the ring's first
// messages, as a Communicator with verify_collectives does) and rank 1 runs the ring without
// it (as a rank with verify_collectives off would: Communicator::Create now refuses ranks that
// differ, so the mismatch is built from the ring and the handshake directly). Every rank must
// fail with a Gloo timeout by its deadline (the collective's, shorter here than the meshes' own
// timeout), whatever it waits for: rank 0 its neighbour's header, rank 1 its neighbour's data.
#include <gloo/context.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/core/errors.h"
#include "comm/core/op_spec.h"
#include "comm/core/store.h"
#include "comm/gloo/call.h"
#include "comm/gloo/consistency_check.h"
#include "comm/gloo/pair_teardown.h"
#include "comm/gloo/posted_buffers.h"
#include "comm/gloo/rendezvous.h"
#include "comm/gloo/ring_allreduce.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using Clock = std::chrono::steady_clock;

// The collective's deadline is kTimeout after its start; the meshes' own timeout (Gloo's, fixed
// when a pair connects, which its bound buffers and default waits use) is 10x longer, so a wait
// bounded by the mesh's timeout instead of the deadline shows.
constexpr std::chrono::milliseconds kTimeout{2000};
constexpr std::chrono::milliseconds kMeshTimeout = 10 * kTimeout;

void RingWithCheckOnRankZeroOnly(size_t count) {
  RunRanksWithStore(2, LaunchMode::kThreads, [count](int rank, std::shared_ptr<Store> store) {
    std::shared_ptr<gloo::Context> data =
        ConnectGlooMesh(std::make_shared<PrefixStore>("data/", store), rank, 2, {"127.0.0.1", "", kMeshTimeout});
    std::shared_ptr<gloo::Context> signatures = ConnectGlooMesh(std::make_shared<PrefixStore>("sig/", store), rank,
                                                                2, {"127.0.0.1", "", kMeshTimeout}, data->getDevice());
    CollectiveHandshake handshake(*signatures);
    RetiredBuffers retired;
    CollectiveScratch scratch;
    std::vector<float> buffer(count, 1.0f);
    OpSpec spec;
    spec.kind = OpKind::kAllreduce;
    spec.dtype = DType::kFloat32;
    spec.count = count;
    const auto start = Clock::now();
    const auto deadline = start + kTimeout;
    StagedHandshake staged(handshake, spec, deadline);
    GlooCall call{data, 1, deadline, &scratch, &retired, rank == 0 ? &staged : nullptr};
    std::string error;
    try {
      RingAllreduce(call, Buffer{buffer.data(), count, DType::kFloat32, Device::CPU()}, ReduceOp::kSum);
    } catch (const std::exception& e) {
      error = e.what();
    }
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    EXPECT_NE(error, "") << "rank " << rank << ": the ring returned without its peer's data";
    // Rank 1 times out, unless rank 0 reached its own deadline first: its failed ring then
    // closed its pairs (RingAllreduce abandons them), and rank 1's wait ends on the reset.
    if (rank == 0) {
      EXPECT_NE(error.find("no header from rank 1"), std::string::npos) << "rank 0: " << error;
    } else {
      EXPECT_TRUE(error.find("Timed out") != std::string::npos || error.find("reset by peer") != std::string::npos)
          << "rank 1: " << error;
    }
    // A safety net, not a timing: a wait bounded by the deadline ends within it plus Gloo's
    // teardown; one bounded by the mesh's timeout only would take 10x the deadline.
    EXPECT_LT(took, 4 * kTimeout) << "rank " << rank << " waited " << took.count() << " ms past a "
                                  << kTimeout.count() << " ms deadline; error: " << error;
    auto rest = handshake.TakeRetiredBuffers();
    store->set("done_" + std::to_string(rank), {'1'});
    store->wait({"done_0", "done_1"}, 2 * kMeshTimeout);
    DestroyPairs(*signatures);
    DestroyPairs(*data);
    retired.TakeAll();
  });
}

// 2^20 float32 (4 MiB): the size that hung a c10d all-reduce between a rank with the check and
// one without.
TEST(RingDeadlineTest, RankWithoutTheCheckAgainstOneWithIt) { RingWithCheckOnRankZeroOnly(1 << 20); }

}  // namespace
}  // namespace testing
}  // namespace gossipcc
