// The two communicators a two-level algorithm runs on, split from a communicator by the hosts
// it learned (Communicator::topology()): `host`, the ranks of this rank's host (its rank: the
// local rank), and `across`, the ranks with this rank's local rank, one per host (its rank: the
// host's index). On H hosts of G ranks, an algorithm that reduces inside `host` and exchanges a
// 1/G share over `across` puts one copy of the data on each host's NIC, carried by its G ranks
// in parallel (docs/comm.md, "Hosts with several ranks").
#pragma once

#include <exception>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/core/store.h"
#include "comm/core/topology.h"

namespace gossipcc {

struct HostGroups {
  std::unique_ptr<Communicator> host;
  std::unique_ptr<Communicator> across;
  int host_index = 0;  // this rank's host (== across->rank())
  int local_rank = 0;  // this rank's place on it (== host->rank())
  Topology topology;   // the parent's: which parent rank is local rank l of host h

  // Collective over `parent`: every rank calls it with the same `store` (the one `parent` was
  // created on, or any store every rank reaches) and the same `prefix`, unused by other groups.
  // The groups get `parent`'s options (flat topology: each is one host, or one rank per host).
  // InvalidArgumentError naming the hosts when they hold different numbers of ranks; Create's
  // errors (a rank that never arrives: TimeoutError) otherwise.
  static HostGroups Split(const Communicator& parent, std::shared_ptr<Store> store, const std::string& prefix);
};

// After a step each rank of a host ran on its own (a slice or tensors across hosts): every rank
// of `host` calls it with its step's failure (null: success). One all-gather of a flag inside
// the host; then this rank's own failure is rethrown, or, where another local rank failed, a
// CommError "<where>: local rank r of this host failed its step across hosts". So every rank of
// the host raises, none waits out its timeout in a later collective of the host.
void RaiseUnlessEveryLocalRankSucceeded(Communicator& host, std::exception_ptr failure, const std::string& where);

}  // namespace gossipcc
