// The c10d backend's settings from the environment (GOSSIPCC_* variables, and
// GLOO_SOCKET_IFNAME as torch's Gloo backend reads it), their validation, and the check at
// process group creation that every rank shares the settings that must agree. docs/pytorch.md,
// "Environment variables", lists the same variables (a test compares the two). Torch-free.
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
// What `python -m gossipcc.info` shows: every set variable, each checked by what a process
// group's creation runs on it (the parsers and ranges of CommunicatorOptionsFromEnvironment,
// AllreducePolicy::Parse, the listening interface or host name as the communicator chooses it,
// and the PowerSGD CPU kernels as PowerSGD selects them).
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

// The check at creation, before any connection: every rank publishes its shared settings in
// `store` (or, with `own_error` non-empty, the error its settings gave, which it then raises)
// and reads every other rank's within `timeout`. Throws on every rank alike:
// InvalidArgumentError naming each setting that differs and every rank's value, or the ranks
// whose settings are invalid and why; TimeoutError naming the ranks that never published.
void AgreeOnSharedSettings(Store& store, int rank, int size, const std::vector<SharedSetting>& mine,
                           const std::string& own_error, std::chrono::milliseconds timeout);

}  // namespace torch_backend
}  // namespace gossipcc
