// Which address a rank listens on, chosen as ProcessGroupGloo chooses it, so that a job launched
// as PyTorch jobs are (torchrun, Slurm, MASTER_ADDR) works across hosts without naming an interface.
#pragma once

#include <string>
#include <vector>

namespace gossipcc {

// ChooseListenAddress's result: Gloo's TCP device is created on `interface` if set, else `hostname`.
struct ListenAddress {
  std::string interface;
  std::string hostname;
  // How it was chosen, for messages ("interface eth0", "this host's name node7 (10.0.0.7)").
  std::string description;
  bool loopback = false;  // only this host can reach it
};

// `interface` (must exist), else `hostname` (must resolve to an address of this host), else
// this host's name if it resolves to one, else loopback with a warning once per process.
// InvalidArgumentError names what was wrong and lists this host's interfaces or addresses.
ListenAddress ChooseListenAddress(const std::string& interface, const std::string& hostname);

// "lo (127.0.0.1, ::1), eth0 (10.0.0.7)": this host's interfaces that have an address.
std::string DescribeHostInterfaces();

// Whether `text` (an address as Gloo prints it, e.g. "[127.0.0.1]:4242") names a loopback address.
bool MentionsLoopbackAddress(const std::string& text);

}  // namespace gossipcc
