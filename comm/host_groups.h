// The two communicators a two-level algorithm runs on, split from a communicator by its hosts
// (Communicator::topology()): `host`, the ranks of this rank's host, and `across`, the ranks with
// this rank's local rank, one per host (docs/comm.md, "Hosts with several ranks").
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

  // Collective over `parent`: every rank passes the same `store` (any that every rank reaches) and
  // the same `prefix`, unused by other groups. The groups get `parent`'s options, flat topology.
  // InvalidArgumentError naming the hosts if they hold different numbers of ranks; else Create's
  // errors (a rank that never arrives: TimeoutError).
  static HostGroups Split(const Communicator& parent, std::shared_ptr<Store> store, const std::string& prefix);
};

// After a step each rank of `host` ran on its own, every rank of `host` calls this with its step's
// failure (null: success): this rank's own failure is rethrown, else, if another local rank failed,
// a CommError "<where>: local rank r of this host failed its step across hosts". So every rank of
// the host raises, and none waits out its timeout in a later collective of the host.
void RaiseUnlessEveryLocalRankSucceeded(Communicator& host, std::exception_ptr failure, const std::string& where);

}  // namespace gossipcc
