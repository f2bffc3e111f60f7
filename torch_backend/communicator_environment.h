// The c10d backend's settings from the environment (GOSSIPCC_* variables, and GLOO_SOCKET_IFNAME
// as torch's Gloo backend reads it), their validation, and the check at creation that every rank
// shares those that must agree. Torch-free. docs/pytorch.md lists them (a test compares the two).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "comm/core/options.h"
#include "comm/core/store.h"
#include "torch_backend/allreduce_policy.h"

namespace gossipcc {
namespace torch_backend {

// One environment variable the backend reads.
struct EnvironmentVariable {
  const char* name;
  const char* default_value;  // as docs/pytorch.md's table shows it
  bool must_agree;            // every rank must set the same value (checked at creation)
};
// Every variable, in the order of docs/pytorch.md's table. GOSSIPCC_ALLREDUCE is read by the
// Python package (gossipcc.configure takes precedence) and validated by AllreducePolicy::Parse.
const std::vector<EnvironmentVariable>& EnvironmentVariables();

// `base` with the group's `timeout` and what the environment sets (an unset or empty variable
// leaves its field). Throws InvalidArgumentError naming every variable whose value does not
// parse or is out of range (ValidateCommunicatorOptions's ranges), and GOSSIPCC_CUDA_DEVICE
// when no such CUDA device is visible to this process.
CommunicatorOptions CommunicatorOptionsFromEnvironment(CommunicatorOptions base, std::chrono::milliseconds timeout);

// One variable of EnvironmentVariables() that is set (non-empty), validated.
struct EnvironmentFinding {
  std::string name;
  std::string value;
  std::string error;  // empty: valid
  std::string note;   // e.g. "not used: GOSSIPCC_SOCKET_IFNAME is set"
};
// What `python -m gossipcc.info` shows: every set variable, checked as a process group's creation
// checks it (CommunicatorOptionsFromEnvironment's parsers and ranges, AllreducePolicy::Parse, the
// listening interface or host name, the PowerSGD CPU kernels as PowerSGD selects them).
std::vector<EnvironmentFinding> CheckEnvironment();

// A setting every rank of a group must share, as one rank has it.
struct SharedSetting {
  std::string id;     // the same on every rank: which setting
  std::string name;   // what the user sets: "GOSSIPCC_COLLECTIVE_LANES", "gossipcc.configure(allreduce=...)"
  std::string value;  // its normal form, compared across ranks
  bool set = false;   // false: `name` is unset on this rank (the value is the default, or the C++ caller's)
};

// The settings of `options` and `policy` that every rank must share. `policy_source` names
// where the policy came from ("GOSSIPCC_ALLREDUCE", "gossipcc.configure(allreduce=...)";
// empty: ProcessGroupOptions::allreduce_policy).
std::vector<SharedSetting> SharedSettings(const CommunicatorOptions& options, const AllreducePolicy& policy,
                                          const std::string& policy_source);

// The check at creation, before any connection: every rank publishes in `store` its shared
// settings (or `own_error`, if non-empty, which it then raises) and reads every other rank's
// within `timeout`. Throws alike on every rank: InvalidArgumentError naming each differing setting
// and every rank's value, or the invalid ranks and why; TimeoutError naming ranks never published.
void AgreeOnSharedSettings(Store& store, int rank, int size, const std::vector<SharedSetting>& mine,
                           const std::string& own_error, std::chrono::milliseconds timeout);

}  // namespace torch_backend
}  // namespace gossipcc
