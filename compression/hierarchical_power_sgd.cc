#include "compression/hierarchical_power_sgd.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace compression {
namespace {

// Every work waited for (the staged buffers they use outlive them all); then the first error.
void WaitAll(const std::vector<std::shared_ptr<Work>>& works) {
  std::exception_ptr first;
  for (const auto& w : works) {
    try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

// By the key alone, so that a key's state stays on one rank whatever else a call holds.
int LocalRankOfKey(const std::string& key, int ranks) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: the same on every rank and platform
  for (char c : key) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return static_cast<int>(h % static_cast<uint64_t>(ranks));
}

PowerSGDStats HierarchicalPowerSGDAllReduce(PowerSGD& across, HostGroups& groups,
                                            absl::Span<const GradientTensor> tensors) {
  Communicator& host = *groups.host;
  const std::string where =
      absl::StrCat("gossipcc hierarchical PowerSGD on host ", groups.host_index, ", local rank ", groups.local_rank);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Buffer& b = tensors[i].data;
    if (b.device.is_cuda() || !IsFloatingPoint(b.dtype) || (b.count > 0 && b.data == nullptr)) {
      throw InvalidArgumentError(absl::StrCat(where, ": tensor ", i, " (", tensors[i].key, ") is ", b.ToString(),
                                              "; CPU tensors of a floating dtype only"));
    }
  }

  // 1. A copy of every tensor, averaged over the host's ranks.
  std::vector<std::vector<uint64_t>> staged(tensors.size());
  std::vector<GradientTensor> views(tensors.begin(), tensors.end());
  std::vector<std::shared_ptr<Work>> works;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Buffer& b = tensors[i].data;
    staged[i].resize((b.bytes() + sizeof(uint64_t) - 1) / sizeof(uint64_t));
    if (b.count) std::memcpy(staged[i].data(), b.data, b.bytes());
    views[i].data.data = staged[i].data();
    works.push_back(host.allreduce(views[i].data, ReduceOp::kAvg));
  }
  WaitAll(works);

  // 2. This rank's tensors, through PowerSGD among one rank per host.
  std::vector<int> owner(views.size());
  std::vector<GradientTensor> mine;
  for (size_t i = 0; i < views.size(); ++i) {
    owner[i] = LocalRankOfKey(views[i].key, host.size());
    if (owner[i] == groups.local_rank) mine.push_back(views[i]);
  }
  PowerSGDStats stats;
  std::exception_ptr failure;
  if (!mine.empty()) {  // the same on the H ranks of this local rank: the deal is
    try {
      stats = across.AllReduce(*groups.across, mine);
    } catch (...) {
      failure = std::current_exception();
    }
  }

  // 3. Every local rank's step succeeded, or every rank of the host raises.
  RaiseUnlessEveryLocalRankSucceeded(host, failure, where);

  // 4. Each tensor from the rank that ran it, then back into the caller's memory.
  works.clear();
  for (size_t i = 0; i < views.size(); ++i) works.push_back(host.broadcast(views[i].data, owner[i]));
  WaitAll(works);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].data.count) std::memcpy(tensors[i].data.data, staged[i].data(), tensors[i].data.bytes());
  }
  return stats;
}

}  // namespace compression
}  // namespace gossipcc
