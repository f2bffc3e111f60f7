// gossipcc's process group from C++ (no Python): each rank opens a c10d FileStore on a shared
// path, constructs ProcessGroupGossipcc on it, and calls c10d's standard collectives and one
// of gossipcc's own (a push-sum round) on CPU tensors.
//
//   bazel run //torch_backend/examples:cpp_allreduce                 # starts 4 ranks itself
//   cpp_allreduce --rank=R --world_size=N --store=/shared/path      # one rank, e.g. per host
//
// Without --rank the program forks `world_size` copies of itself as the ranks (a store file
// in a temporary directory) and exits non-zero if any rank's result is wrong. Its test,
// //torch_backend/examples:cpp_allreduce_test, runs exactly that.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include "torch_backend/process_group_gossipcc.h"

namespace {

using gossipcc::torch_backend::ProcessGroupGossipcc;
using gossipcc::torch_backend::ProcessGroupOptions;

bool Check(bool ok, int rank, const char* what) {
  if (!ok) std::fprintf(stderr, "rank %d: %s is wrong\n", rank, what);
  return ok;
}

// One rank's work. Returns true when every result matches its reference.
bool RunRank(int rank, int world_size, const std::string& store_path) {
  auto store = c10::make_intrusive<::c10d::FileStore>(store_path, world_size);
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(30);
  // Rendezvous: returns once every rank has constructed its process group.
  auto pg = c10::make_intrusive<ProcessGroupGossipcc>(store, rank, world_size, options);
  bool ok = true;

  // All-reduce (sum): rank r contributes r + 1 everywhere.
  std::vector<at::Tensor> sum = {at::full({1000}, static_cast<double>(rank + 1), at::kFloat)};
  pg->allreduce(sum, ::c10d::AllreduceOptions())->wait();
  const float expected_sum = world_size * (world_size + 1) / 2.0f;
  ok &= Check(at::all(sum[0] == expected_sum).item<bool>(), rank, "allreduce");

  // Broadcast from rank 0.
  std::vector<at::Tensor> data = {rank == 0 ? at::arange(16, at::kDouble) : at::zeros({16}, at::kDouble)};
  ::c10d::BroadcastOptions broadcast;
  broadcast.rootRank = 0;
  pg->broadcast(data, broadcast)->wait();
  ok &= Check(at::equal(data[0], at::arange(16, at::kDouble)), rank, "broadcast");

  // All-gather: every rank's rank, in rank order. The future completes with the outputs.
  std::vector<std::vector<at::Tensor>> gathered(1);
  for (int r = 0; r < world_size; ++r) gathered[0].push_back(at::empty({1}, at::kLong));
  std::vector<at::Tensor> mine = {at::full({1}, rank, at::kLong)};
  auto work = pg->allgather(gathered, mine, ::c10d::AllgatherOptions());
  work->wait();
  for (int r = 0; r < world_size; ++r) ok &= Check(gathered[0][r].item<int64_t>() == r, rank, "allgather");

  // gossipcc's own collective: one push-sum round on the one-peer exponential graph. The
  // sums of x and of the weights over the ranks are conserved by every round.
  std::vector<at::Tensor> x = {at::full({8}, static_cast<double>(rank), at::kDouble)};
  at::Tensor weight = at::ones({1}, at::kDouble);
  pg->gossip().push_sum_round(x, weight, /*step=*/0, "exponential", std::nullopt)->wait();
  std::vector<at::Tensor> totals = {at::cat({x[0].sum().reshape({1}), weight})};
  pg->allreduce(totals, ::c10d::AllreduceOptions())->wait();
  const double x_total = 8.0 * world_size * (world_size - 1) / 2.0;
  ok &= Check(std::abs(totals[0][0].item<double>() - x_total) < 1e-9, rank, "push-sum's conserved sum of x");
  ok &= Check(std::abs(totals[0][1].item<double>() - world_size) < 1e-12, rank, "push-sum's conserved weight");

  pg->barrier(::c10d::BarrierOptions())->wait();
  if (ok) std::printf("rank %d of %d: allreduce, broadcast, allgather and a push-sum round agree\n", rank, world_size);
  return ok;
}

// The value of --name=VALUE, or `fallback`.
std::string Flag(int argc, char** argv, const char* name, const std::string& fallback = "") {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int world_size = std::atoi(Flag(argc, argv, "world_size", "4").c_str());
  const int rank = std::atoi(Flag(argc, argv, "rank", "-1").c_str());
  if (world_size < 1 || rank >= world_size) {
    std::fprintf(stderr, "usage: %s [--world_size=N] [--rank=R --store=PATH]\n", argv[0]);
    return 2;
  }
  if (rank >= 0) {
    const std::string store = Flag(argc, argv, "store");
    if (store.empty()) {
      std::fprintf(stderr, "--rank needs --store=PATH (a file every rank can reach)\n");
      return 2;
    }
    try {
      return RunRank(rank, world_size, store) ? 0 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      return 1;
    }
  }

  // Launcher: fork the ranks (before any thread exists in this process), one store file.
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/gossipcc_cpp_example_XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string store = dir + "/store";
  std::vector<pid_t> children;
  for (int r = 0; r < world_size; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      int code = 1;
      try {
        code = RunRank(r, world_size, store) ? 0 : 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::remove(store.c_str());
  rmdir(dir.c_str());
  if (failed) std::fprintf(stderr, "%d of %d ranks failed\n", failed, world_size);
  return failed ? 1 : 0;
}
