#include "algorithms/uneven_allreduce_sgd.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "algorithms/elementwise.h"
#include "comm/core/errors.h"

namespace gossipcc {

using gossip_internal::CheckBuffers;
using gossip_internal::DispatchFloating;
using gossip_internal::HostStaging;
using gossip_internal::TotalCount;

namespace {

template <typename W>
UnevenAllReduceSGD::StepResult RunT(Communicator& comm, const std::vector<Buffer>& host, DType dtype,
                                    bool contribute) {
  const size_t total = TotalCount(host);
  std::vector<W> packed(total + 2, W(0));
  if (contribute) {
    DispatchFloating(dtype, [&](auto e) {
      using E = decltype(e);
      size_t k = 0;
      for (const Buffer& b : host) {
        const auto* g = static_cast<const typename E::Storage*>(b.data);
        for (size_t i = 0; i < b.count; ++i) packed[k++] = static_cast<W>(E::Load(g[i]));
      }
    });
  }
  packed[total] = contribute ? W(1) : W(0);      // contributors
  packed[total + 1] = contribute ? W(1) : W(0);  // still training
  comm.allreduce(CpuBuffer(packed.data(), packed.size()), ReduceOp::kSum)->wait();
  UnevenAllReduceSGD::StepResult r;
  r.contributors = static_cast<int>(std::lround(static_cast<double>(packed[total])));
  r.still_training = static_cast<int>(std::lround(static_cast<double>(packed[total + 1])));
  DispatchFloating(dtype, [&](auto e) {
    using E = decltype(e);
    size_t k = 0;
    for (const Buffer& b : host) {
      auto* g = static_cast<typename E::Storage*>(b.data);
      for (size_t i = 0; i < b.count; ++i) {
        g[i] = E::Store(static_cast<typename E::Compute>(r.contributors > 0 ? packed[k] / static_cast<W>(r.contributors)
                                                                            : W(0)));
        ++k;
      }
    }
  });
  return r;
}

}  // namespace

UnevenAllReduceSGD::StepResult UnevenAllReduceSGD::Run(Communicator& comm, std::vector<Buffer>& grads,
                                                       bool contribute) {
  const DType dtype = CheckBuffers("uneven_allreduce_sgd", grads);
  HostStaging staging("uneven_allreduce_sgd", grads, /*load=*/contribute);
  StepResult r = dtype == DType::kFloat64 ? RunT<double>(comm, staging.host(), dtype, contribute)
                                          : RunT<float>(comm, staging.host(), dtype, contribute);
  staging.WriteBack();
  ++collectives_;
  if (contribute) {
    ++steps_contributed_;
    ++steps_since_sync_;
  }
  return r;
}

UnevenAllReduceSGD::StepResult UnevenAllReduceSGD::SumAndNormalizeGradients(Communicator& comm,
                                                                            std::vector<Buffer> grads) {
  return Run(comm, grads, true);
}

bool UnevenAllReduceSGD::JoinUntilAllDone(Communicator& comm, std::vector<Buffer> grads) {
  return Run(comm, grads, false).still_training > 0;
}

int UnevenAllReduceSGD::Winner(const std::vector<int64_t>& steps_per_rank) {
  if (steps_per_rank.empty()) throw InvalidArgumentError("uneven_allreduce_sgd: no step counts to choose a winner from");
  int winner = 0;
  for (size_t r = 0; r < steps_per_rank.size(); ++r) {
    if (steps_per_rank[r] < 0) {
      throw InvalidArgumentError(absl::StrCat("uneven_allreduce_sgd: rank ", r, " reports ", steps_per_rank[r], " steps"));
    }
    // >=: the last of the ranks tied for the most steps (torch-distlearn's ascending sort puts
    // it last); "> 0": with no steps anywhere rank 0 stays the winner.
    if (steps_per_rank[r] >= steps_per_rank[winner] && steps_per_rank[r] > 0) winner = static_cast<int>(r);
  }
  return winner;
}

int UnevenAllReduceSGD::SynchronizeParameters(Communicator& comm, std::vector<Buffer> params) {
  CheckBuffers("uneven_allreduce_sgd synchronize", params);
  // Every rank gets every rank's count and computes the same winner without further messages.
  int64_t mine = steps_since_sync_;
  std::vector<int64_t> steps(comm.size());
  comm.allgather(CpuBuffer(&mine, 1), CpuBuffer(steps.data(), steps.size()))->wait();
  const int winner = Winner(steps);
  HostStaging staging("uneven_allreduce_sgd synchronize", params, /*load=*/comm.rank() == winner);
  std::vector<std::shared_ptr<Work>> works;
  for (const Buffer& b : staging.host()) works.push_back(comm.broadcast(b, winner));
  for (auto& w : works) w->wait();
  staging.WriteBack();
  steps_since_sync_ = 0;
  return winner;
}

void UnevenAllReduceSGD::Restore(int64_t steps_contributed, int64_t collectives, int64_t steps_since_sync) {
  if (steps_since_sync < 0 || steps_contributed < steps_since_sync || collectives < steps_contributed) {
    throw InvalidArgumentError(absl::StrCat("uneven_allreduce_sgd: restore with steps_contributed ", steps_contributed,
                                            ", collectives ", collectives, " and steps_since_sync ", steps_since_sync,
                                            " (need 0 <= steps_since_sync <= steps_contributed <= collectives)"));
  }
  steps_contributed_ = steps_contributed;
  collectives_ = collectives;
  steps_since_sync_ = steps_since_sync;
}

}  // namespace gossipcc
