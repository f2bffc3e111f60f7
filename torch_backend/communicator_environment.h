// The c10d backend's communicator settings from the environment (GOSSIPCC_* variables, and
// GLOO_SOCKET_IFNAME as torch's Gloo backend reads it): docs/pytorch.md lists them. Torch-free.
#pragma once

#include <chrono>

#include "comm/options.h"

namespace gossipcc {
namespace torch_backend {

// `base` with the group's `timeout` and what the environment sets (an unset or empty variable
// leaves its field); throws InvalidArgumentError naming a variable whose value does not parse.
// The Communicator checks the ranges.
CommunicatorOptions CommunicatorOptionsFromEnvironment(CommunicatorOptions base, std::chrono::milliseconds timeout);

}  // namespace torch_backend
}  // namespace gossipcc
