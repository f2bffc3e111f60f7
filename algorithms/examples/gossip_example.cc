// A complete gossip program: 8 ranks (threads here; processes or hosts work the same with a
// FileStore or another Store) each hold a different vector and run SGP's push-sum on the
// one-peer exponential graph. Each round every rank sends ONE message (half its values and
// half its weight) to one peer; after log2(8) = 3 rounds every rank holds the exact mean.
// Then the same rounds asynchronously on an OpLane (overlapping this thread's work, as OSGP
// does), two steps of D-PSGD on a ring and one bilateral exchange.
//
//   bazel run //algorithms/examples:gossip_example
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/bilateral_exchange.h"
#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "algorithms/symmetric_gossip.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/sched/op_lane.h"

int main() {
  constexpr int kRanks = 8;
  auto store = gossipcc::MakeHashStore();  // in-process rendezvous
  std::vector<std::thread> ranks;
  std::vector<int> failures(kRanks, 0);
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto comm = gossipcc::Communicator::Create(store, rank, kRanks);

        // Push-sum (SGP): x is the numerator, the weight lives in the PushSum object.
        std::shared_ptr<const gossipcc::PeerGraph> graph = gossipcc::MakePeerGraph("exponential:peers=1", kRanks);
        gossipcc::PushSum sgp(graph);
        std::vector<float> x(1000, static_cast<float>(rank));  // mean over ranks: 3.5
        for (int k = 0; k < 3; ++k) sgp.Step(*comm, {gossipcc::CpuBuffer(x.data(), x.size())});
        // One message per round: 1000 floats + the 8-byte weight + the 16-byte header (step, scale).
        if (comm->traffic().p2p_bytes_sent != 3 * (1000 * sizeof(float) + 24)) failures[rank] = 1;
        std::vector<float> z(x.size());
        sgp.Debias(gossipcc::CpuBuffer(x.data(), x.size()), gossipcc::CpuBuffer(z.data(), z.size()));  // z = x / w
        if (z[0] != 3.5f || z[999] != 3.5f || sgp.weight() != 1.0) failures[rank] = 1;

        // The same rounds asynchronously: each is a task on an OpLane (in issue order, off this
        // thread), and its Work completes when the round is done; meanwhile this thread computes.
        // The lane is declared after what its tasks use: destroyed (joined) first.
        gossipcc::PushSum osgp(graph);
        std::vector<float> u(1000, static_cast<float>(rank));
        gossipcc::OpLane lane("gossip example");
        std::vector<std::shared_ptr<gossipcc::Work>> rounds;
        for (int k = 0; k < 3; ++k) {
          rounds.push_back(lane.Submit(
              "push-sum round " + std::to_string(k),
              [&] { osgp.Step(*comm, {gossipcc::CpuBuffer(u.data(), u.size())}); }, /*uses_collectives=*/false));
        }
        double work = 0;
        for (int i = 0; i < 1000000; ++i) work += 1e-6;  // the computation the rounds overlap
        for (auto& round : rounds) round->wait();           // rethrows a round's error
        osgp.Debias(gossipcc::CpuBuffer(u.data(), u.size()), gossipcc::CpuBuffer(z.data(), z.size()));
        if (z[0] != 3.5f || osgp.weight() != 1.0 || work <= 0) failures[rank] = 1;

        // D-PSGD: doubly stochastic mixing on an undirected ring (1/3 each), no weight.
        gossipcc::SymmetricGossip dpsgd(gossipcc::MakePeerGraph("ring", kRanks));
        std::vector<double> y(4, rank == 0 ? 8.0 : 0.0);
        dpsgd.Step(*comm, {gossipcc::CpuBuffer(y.data(), y.size())});
        dpsgd.Step(*comm, {gossipcc::CpuBuffer(y.data(), y.size())});

        // AD-PSGD, synchronous: partners of the round-robin matching average pairwise.
        gossipcc::BilateralExchange adpsgd;
        const int partner = adpsgd.Partner(rank, adpsgd.step(), kRanks);
        adpsgd.Step(*comm, {gossipcc::CpuBuffer(y.data(), y.size())});

        std::printf("rank %d: push-sum mean %.2f (weight %.1f, %llu bytes sent); D-PSGD+AD-PSGD value %.4f "
                    "(exchanged with rank %d)\n",
                    rank, z[0], sgp.weight(), static_cast<unsigned long long>(comm->traffic().p2p_bytes_sent), y[0],
                    partner);
      } catch (const gossipcc::CommError& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        failures[rank] = 1;
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int f : failures) {
    if (f) return 1;
  }
  return 0;
}
