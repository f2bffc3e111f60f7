// Which ranks share a host, and the groups a two-level (hierarchical) collective runs on: the
// ranks of one host (fast links), and for each local index i the ranks with local index i on
// every host (one per host, across the hosts' NICs).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gossipcc {

class Topology {
 public:
  // Every rank on a host of its own (n hosts of one rank).
  static Topology Flat(int size);
  // From each rank's host key, in rank order: equal keys, one host. Hosts are numbered in the
  // order of their lowest rank; a host's ranks are in rank order (local rank = position).
  // `names` (same length) are what messages call the hosts.
  static Topology FromHostKeys(const std::vector<std::string>& keys, const std::vector<std::string>& names);

  int size() const { return static_cast<int>(host_of_.size()); }
  int hosts() const { return static_cast<int>(ranks_of_host_.size()); }
  int host_of(int rank) const { return host_of_[static_cast<size_t>(rank)]; }
  int local_rank(int rank) const { return local_rank_[static_cast<size_t>(rank)]; }
  const std::vector<int>& ranks_on_host(int host) const { return ranks_of_host_[static_cast<size_t>(host)]; }
  // The ranks with `rank`'s local rank, one per host, in host order (`rank` among them). Only
  // when every host has as many ranks (uniform()).
  std::vector<int> across_hosts(int rank) const;
  // Every host has the same number of ranks.
  bool uniform() const;
  // Some host has more than one rank.
  bool any_host_shared() const;
  // "2 hosts: nodeA (ranks 0, 1), nodeB (ranks 2, 3)".
  std::string Describe() const;

 private:
  std::vector<int> host_of_;
  std::vector<int> local_rank_;
  std::vector<std::vector<int>> ranks_of_host_;
  std::vector<std::string> host_names_;
};

// This process's host key when CommunicatorOptions::host_key is empty: the kernel's boot id and
// the network namespace, so ranks on one machine and one network stack share a host (an
// emulated host is a namespace of its own); and its name for messages (the host name, with the
// namespace where it is not the machine's first).
std::string DefaultHostKey();
std::string DefaultHostName();

}  // namespace gossipcc
