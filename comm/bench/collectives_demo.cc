// The main job (until the c10d backend lands): N local ranks rendezvous through a store and
// run every collective of the comm layer, printing sizes, times and bus bandwidth.
//
//   bazel run //comm/bench:collectives_demo -- --ranks=4 --max_bytes=67108864
//
// Bus bandwidth follows nccl-tests: algorithm bandwidth (bytes / time) times 2(n-1)/n for
// allreduce, (n-1)/n for allgather, reduce_scatter and alltoall, 1 for broadcast.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/bench/local_ranks.h"
#include "comm/communicator.h"

namespace gossipcc {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  int ranks = 4;
  size_t min_bytes = 4 << 10;
  size_t max_bytes = 64 << 20;
};

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("ranks")) f.ranks = std::atoi(v);
    else if (const char* v = value("min_bytes")) f.min_bytes = std::strtoull(v, nullptr, 10);
    else if (const char* v = value("max_bytes")) f.max_bytes = std::strtoull(v, nullptr, 10);
    else {
      fprintf(stderr, "unknown flag %s\nflags: --ranks=N (default 4) --min_bytes=B --max_bytes=B\n", argv[i]);
      std::exit(2);
    }
  }
  if (f.ranks < 1 || f.min_bytes < 4 || f.max_bytes < f.min_bytes) {
    fprintf(stderr, "invalid flags: need ranks >= 1 and 4 <= min_bytes <= max_bytes\n");
    std::exit(2);
  }
  return f;
}

// Median seconds of `iters` runs of fn (after one warm-up), agreed on by all ranks (max).
template <typename Fn>
double Time(Communicator& comm, int iters, Fn fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    comm.barrier()->wait();
    const auto start = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  double median = t[t.size() / 2];
  comm.allreduce(CpuBuffer(&median, 1), ReduceOp::kMax)->wait();
  return median;
}

int RunRank(const Flags& flags, int rank, std::shared_ptr<Store> store) {
  auto comm = Communicator::Create(store, rank, flags.ranks);
  const int n = comm->size();
  if (rank == 0) {
    printf("gossipcc collectives demo: %d ranks (local processes, Gloo TCP over loopback), float32\n", n);
    printf("%-15s %10s %12s %14s %14s\n", "collective", "bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  }
  for (size_t bytes = flags.min_bytes; bytes <= flags.max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    const size_t chunk = std::max<size_t>(count / n, 1);
    std::vector<float> a(std::max(count, chunk * n), 1.0f), b(std::max(count, chunk * n), 0.0f);
    const int iters = bytes >= (16u << 20) ? 3 : bytes >= (1u << 20) ? 7 : 21;
    struct Row {
      const char* name;
      double factor;
      std::function<void()> fn;
    };
    const double nn = n;
    std::vector<Row> rows = {
        {"allreduce", 2 * (nn - 1) / nn, [&] { comm->allreduce(CpuBuffer(a.data(), count))->wait(); }},
        {"broadcast", 1.0, [&] { comm->broadcast(CpuBuffer(a.data(), count), 0)->wait(); }},
        {"allgather", (nn - 1) / nn,
         [&] { comm->allgather(CpuBuffer(a.data(), chunk), CpuBuffer(b.data(), chunk * n))->wait(); }},
        {"reduce_scatter", (nn - 1) / nn,
         [&] { comm->reduce_scatter(CpuBuffer(a.data(), chunk * n), CpuBuffer(b.data(), chunk))->wait(); }},
        {"alltoall", (nn - 1) / nn,
         [&] { comm->alltoall(CpuBuffer(a.data(), chunk * n), CpuBuffer(b.data(), chunk * n))->wait(); }},
    };
    for (const Row& row : rows) {
      const double seconds = Time(*comm, iters, row.fn);
      const double algbw = bytes / seconds / 1e9;
      if (rank == 0) {
        printf("%-15s %10s %12.1f %14.3f %14.3f\n", row.name, bench::HumanBytes(bytes).c_str(), seconds * 1e6, algbw,
               algbw * row.factor);
      }
    }
  }
  const double barrier = Time(*comm, 21, [&] { comm->barrier()->wait(); });
  if (rank == 0) printf("%-15s %10s %12.1f\n", "barrier", "-", barrier * 1e6);
  return 0;
}

}  // namespace
}  // namespace gossipcc

int main(int argc, char** argv) {
  const auto flags = gossipcc::Parse(argc, argv);
  return gossipcc::bench::RunLocalRanks(flags.ranks, [&](int rank, std::shared_ptr<gossipcc::Store> store) {
    return gossipcc::RunRank(flags, rank, store);
  });
}
