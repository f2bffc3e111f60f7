// Which address a rank listens on, chosen as PyTorch's ProcessGroupGloo chooses it, so that a
// job launched the way PyTorch users launch one (torchrun, Slurm, MASTER_ADDR/RANK/WORLD_SIZE
// and nothing else) works across hosts without naming an interface.
#pragma once

#include <string>
#include <vector>

namespace gossipcc {

// The outcome of ChooseListenAddress: Gloo's TCP device is created on `interface` when set,
// else on `hostname`.
struct ListenAddress {
  std::string interface;
  std::string hostname;
  // How it was chosen, for messages ("interface eth0", "this host's name node7 (10.0.0.7)").
  std::string description;
  bool loopback = false;  // only this host can reach it
};

// `interface` set: that interface, which must exist (InvalidArgumentError listing this host's
// interfaces otherwise). Else `hostname` set: that name or address, which must resolve to an
// address this host can bind (InvalidArgumentError naming what it resolved to and this host's
// addresses otherwise). Else, as ProcessGroupGloo: this host's name if it resolves to an address
// this host can bind; else the loopback address, with a warning on stderr (once per process)
// that names the variables to set, since other hosts cannot reach it.
ListenAddress ChooseListenAddress(const std::string& interface, const std::string& hostname);

// "lo (127.0.0.1, ::1), eth0 (10.0.0.7)": this host's interfaces that have an address.
std::string DescribeHostInterfaces();

// Whether `text` (an address as Gloo prints it, e.g. "[127.0.0.1]:4242") names a loopback address.
bool MentionsLoopbackAddress(const std::string& text);

}  // namespace gossipcc
