// The topics of gossipcc._C, one Register function each. python_module.cc calls them in this
// order: a docstring's signature names a class by its Python name only if registered earlier.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <string>

namespace gossipcc {
namespace torch_backend {

class ProcessGroupGossipcc;

// A blocking algorithm call `fn` on the group's algorithm lane (ordered with its collectives),
// with the GIL released; `what` names it in errors ("gossipcc <what> on rank <r>").
void RunBlocking(ProcessGroupGossipcc& pg, const std::string& what, const std::function<void()>& fn);

// parse_allreduce_policy, powersgd_policy_options, environment_variables, check_environment.
void RegisterSettings(pybind11::module_& m);
// ProcessGroupGossipcc: its construction and gossipcc's own calls on it.
void RegisterProcessGroup(pybind11::module_& m);
// FaultTolerantPushSum, the peer graph queries, ElasticAveraging, UnevenAllReduceSGD.
void RegisterAlgorithms(pybind11::module_& m);
// PowerSGD: its state, collective, stats and checkpoints.
void RegisterCompression(pybind11::module_& m);

}  // namespace torch_backend
}  // namespace gossipcc
