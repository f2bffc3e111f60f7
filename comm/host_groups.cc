#include "comm/host_groups.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"

namespace gossipcc {

HostGroups HostGroups::Split(const Communicator& parent, std::shared_ptr<Store> store, const std::string& prefix) {
  const Topology& topology = parent.topology();
  const int rank = parent.rank();
  if (!topology.uniform()) {
    throw InvalidArgumentError(absl::StrCat("rank ", rank, " of ", parent.size(),
                                            ": HostGroups::Split needs as many ranks on every host, but the ranks are on ",
                                            topology.Describe()));
  }
  HostGroups groups;
  groups.host_index = topology.host_of(rank);
  groups.local_rank = topology.local_rank(rank);
  groups.topology = topology;
  const int per_host = static_cast<int>(topology.ranks_on_host(groups.host_index).size());
  CommunicatorOptions options = parent.options();
  options.topology = TopologyMode::kFlat;
  // The hosts' groups first, then the groups across hosts: every rank creates them in this
  // order, and each Create involves the ranks of one group only, so none waits on another.
  groups.host = Communicator::Create(
      std::make_shared<PrefixStore>(absl::StrCat(prefix, "/host", groups.host_index), store), groups.local_rank,
      per_host, options);
  groups.across = Communicator::Create(
      std::make_shared<PrefixStore>(absl::StrCat(prefix, "/across", groups.local_rank), std::move(store)),
      groups.host_index, topology.hosts(), options);
  return groups;
}

void RaiseUnlessEveryLocalRankSucceeded(Communicator& host, std::exception_ptr failure, const std::string& where) {
  int32_t ok = failure ? 0 : 1;
  std::vector<int32_t> oks(static_cast<size_t>(host.size()));
  host.allgather(CpuBuffer(&ok, 1), CpuBuffer(oks.data(), oks.size()))->wait();
  if (failure) std::rethrow_exception(failure);
  for (size_t r = 0; r < oks.size(); ++r) {
    if (!oks[r]) {
      throw CommError(absl::StrCat(where, ": local rank ", r, " of this host failed its step across hosts ",
                                   "(its own error names why); nothing was modified"));
    }
  }
}

}  // namespace gossipcc
