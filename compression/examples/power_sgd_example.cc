// PowerSGD in a complete program: 4 ranks (threads here; processes or hosts work the same with
// a FileStore or another Store) average the gradients of a small model for a few steps, two
// exact warm-up steps first, then rank-2 PowerSGD; the state is checkpointed and restored.
//
//   bazel run //compression/examples:power_sgd_example
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "compression/power_sgd.h"

using gossipcc::compression::GradientTensor;
using gossipcc::compression::PowerSGD;
using gossipcc::compression::PowerSGDCheckpoint;

int main() {
  constexpr int kRanks = 4;
  auto store = gossipcc::MakeHashStore();  // in-process rendezvous
  std::vector<std::thread> ranks;
  std::vector<int> failures(kRanks, 0);
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        auto comm = gossipcc::Communicator::Create(store, rank, kRanks);
        // The same string the c10d backend reads from GOSSIPCC_ALLREDUCE=powersgd:<options>.
        PowerSGD psgd(gossipcc::compression::ParsePowerSGDOptions("rank=2,start_iter=2"));

        // A model's gradients: a conv kernel, a linear layer and a bias, each with a stable key.
        std::vector<float> conv(32 * 16 * 3 * 3), fc(10 * 128), bias(10);
        std::vector<GradientTensor> grads = {
            {"conv.weight", gossipcc::CpuBuffer(conv.data(), conv.size()), {32, 16, 3, 3}},
            {"fc.weight", gossipcc::CpuBuffer(fc.data(), fc.size()), {10, 128}},
            {"fc.bias", gossipcc::CpuBuffer(bias.data(), bias.size()), {10}},
        };
        std::mt19937 rng(rank);
        std::normal_distribution<float> normal;
        std::string checkpoint;
        for (int step = 0; step < 6; ++step) {
          for (auto* v : {&conv, &fc, &bias})
            for (float& x : *v) x = normal(rng);
          const auto stats = psgd.AllReduce(*comm, grads);  // in place: now the (approximate) average
          if (rank == 0) {
            std::printf("step %d: %d of %d tensors compressed, %llu -> %llu bytes (%.1fx)\n", step,
                        static_cast<int>(stats.compressed_tensors), static_cast<int>(stats.tensors),
                        static_cast<unsigned long long>(stats.bytes_before),
                        static_cast<unsigned long long>(stats.bytes_after), stats.compression_ratio());
          }
          if (step == 3) checkpoint = psgd.SaveState().Serialize();  // e.g. written with the model
          if (!std::isfinite(conv[0]) || !std::isfinite(fc[0])) failures[rank] = 1;
        }
        // Restoring: a fresh object continues from the saved error memory, Q and step counts.
        PowerSGD resumed(psgd.options());
        resumed.LoadState(PowerSGDCheckpoint::Deserialize(checkpoint));
        const auto stats = resumed.AllReduce(*comm, grads);
        if (stats.compressed_tensors != 2) failures[rank] = 1;  // conv and fc; the bias stays exact
        if (rank == 0) std::printf("total: %s\n", psgd.total_stats().ToString().c_str());
      } catch (const gossipcc::CommError& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        failures[rank] = 1;
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int f : failures)
    if (f) return 1;
  return 0;
}
