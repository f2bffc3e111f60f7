// A complete gossipcc program: 4 ranks (threads here; processes or hosts work the same with
// a FileStore or another Store) average a vector with allreduce, then do one gossip-style
// round with their ring neighbours through a fused p2p batch.
//
//   bazel run //comm/examples:ring_example
#include <cstdio>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/core/errors.h"

int main() {
  constexpr int kRanks = 4;
  auto store = gossipcc::MakeHashStore();  // in-process rendezvous
  std::vector<std::thread> ranks;
  std::vector<int> failures(kRanks, 0);
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto comm = gossipcc::Communicator::Create(store, rank, kRanks);

        // 1. Average: every rank ends with the mean of the ranks' values, (0+1+2+3)/4 = 1.5.
        std::vector<float> x(1000, static_cast<float>(rank));
        comm->allreduce(gossipcc::CpuBuffer(x.data(), x.size()), gossipcc::ReduceOp::kAvg)->wait();

        // 2. Gossip round: send to the right neighbour, receive from the left, in one batch.
        const int right = (rank + 1) % kRanks, left = (rank + kRanks - 1) % kRanks;
        std::vector<double> mine(8, rank), from_left(8);
        std::vector<gossipcc::P2POp> round = {
            gossipcc::P2POp::Send(gossipcc::CpuBuffer(mine.data(), mine.size()), right),
            gossipcc::P2POp::Recv(gossipcc::CpuBuffer(from_left.data(), from_left.size()), left),
        };
        comm->p2p(round)->wait();

        if (x[0] != 1.5f || from_left[0] != left) failures[rank] = 1;
        std::printf("rank %d: mean %.2f, received %.0f from rank %d\n", rank, x[0], from_left[0], left);
      } catch (const gossipcc::CommError& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        failures[rank] = 1;
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int f : failures) if (f) return 1;
  return 0;
}
