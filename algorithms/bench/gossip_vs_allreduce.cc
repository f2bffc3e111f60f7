// Time per round of push-sum gossip (one-peer exponential graph, SGP's default) and of D-PSGD
// on a ring, against an exact all-reduce (average) of the same bytes, for n = 2, 4, 8 local
// processes and 1..64 MB of float32 per rank; plus the bytes each rank sent per round,
// measured by the communicator's counters. Push-sum with one peer must send exactly one copy
// of the data plus the 8-byte weight (and our 16-byte header: step and scale).
//
//   bazel run //algorithms/bench:gossip_vs_allreduce [-- --max_mb=64 --ranks=2,4,8]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "algorithms/symmetric_gossip.h"
#include "comm/bench/local_ranks.h"
#include "comm/communicator.h"
#include "comm/core/store.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  double push_sum_ms, dpsgd_ms, allreduce_ms;
  double push_sum_bytes, dpsgd_bytes;
};

int Iterations(size_t bytes) { return bytes >= (32u << 20) ? 3 : bytes >= (8u << 20) ? 5 : 10; }

// Rank body: every measurement; rank 0 reports one row per size.
int RunRank(int rank, int n, std::shared_ptr<gossipcc::Store> store, const std::vector<size_t>& sizes,
            const gossipcc::bench::RowWriter<Row>& out) {
  gossipcc::CommunicatorOptions options;
  options.timeout = std::chrono::seconds(300);
  auto comm = gossipcc::Communicator::Create(std::move(store), rank, n, options);
  std::shared_ptr<const gossipcc::PeerGraph> expo = gossipcc::MakePeerGraph("exponential", n);
  std::shared_ptr<const gossipcc::PeerGraph> ring = gossipcc::MakePeerGraph("ring", n);
  for (size_t bytes : sizes) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> x(count, static_cast<float>(rank));
    const gossipcc::Buffer buf = gossipcc::CpuBuffer(x.data(), count);
    const int iters = Iterations(bytes);
    Row row{};
    auto timed = [&](auto&& op, double* ms, double* sent) {
      op();  // warm-up
      comm->barrier()->wait();
      const uint64_t before = comm->traffic().p2p_bytes_sent;
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) op();
      comm->barrier()->wait();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      *ms = 1e3 * s / iters;
      if (sent) *sent = static_cast<double>(comm->traffic().p2p_bytes_sent - before) / iters;
    };
    gossipcc::PushSum ps(expo);
    gossipcc::SymmetricGossip sg(ring);
    timed([&] { ps.Step(*comm, {buf}); }, &row.push_sum_ms, &row.push_sum_bytes);
    timed([&] { sg.Step(*comm, {buf}); }, &row.dpsgd_ms, &row.dpsgd_bytes);
    timed([&] { comm->allreduce(buf, gossipcc::ReduceOp::kAvg)->wait(); }, &row.allreduce_ms, nullptr);
    if (rank == 0 && !out.Write(row)) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t max_mb = 64;
  std::vector<int> ranks = {2, 4, 8};
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--max_mb=", 9) == 0) max_mb = std::strtoul(argv[i] + 9, nullptr, 10);
    if (std::strncmp(argv[i], "--ranks=", 8) == 0) {
      ranks.clear();
      for (char* p = argv[i] + 8; *p;) {
        ranks.push_back(static_cast<int>(std::strtol(p, &p, 10)));
        if (*p == ',') ++p;
      }
    }
  }
  std::vector<size_t> sizes;
  for (size_t mb = 1; mb <= max_mb; mb *= 4) sizes.push_back(mb << 20);

  std::printf("push-sum: one-peer exponential graph; D-PSGD: undirected ring (2 peers); allreduce: exact average.\n");
  std::printf("float32, times per round (mean over 3-10 rounds after a warm-up), local processes over loopback.\n");
  std::printf("sent/rank: payload bytes one rank sent per round (comm traffic counters); 'expected' for push-sum\n");
  std::printf("is data + 8-byte weight + 16-byte header (step, scale). An exact ring allreduce sends 2(n-1)/n x data.\n\n");
  std::printf("%3s %7s | %12s %12s %10s | %12s %12s | %13s %13s\n", "n", "size", "push-sum ms", "sent/rank",
              "expected", "D-PSGD ms", "sent/rank", "allreduce ms", "allreduce/ps");
  for (int n : ranks) {
    auto size = sizes.begin();
    const int failed = gossipcc::bench::RunLocalRanksWithRows<Row>(
        n,
        [&](int rank, std::shared_ptr<gossipcc::Store> store, const gossipcc::bench::RowWriter<Row>& out) {
          return RunRank(rank, n, std::move(store), sizes, out);
        },
        [&](const Row& row) {
          const size_t bytes = *size++;
          std::printf("%3d %5zuMB | %12.2f %12.0f %10zu | %12.2f %12.0f | %13.2f %12.2fx\n", n, bytes >> 20,
                      row.push_sum_ms, row.push_sum_bytes, bytes + 24, row.dpsgd_ms, row.dpsgd_bytes, row.allreduce_ms,
                      row.allreduce_ms / row.push_sum_ms);
          std::fflush(stdout);
        });
    if (failed) return 1;
  }
  return 0;
}
