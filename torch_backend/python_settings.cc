// gossipcc._C's settings: the allreduce policy string (allreduce_policy.h) and the backend's
// environment variables (communicator_environment.h). Torch-free.
#include <pybind11/pybind11.h>

#include <string>

#include "comm/core/errors.h"
#include "torch_backend/allreduce_policy.h"
#include "torch_backend/communicator_environment.h"
#include "torch_backend/python_bindings.h"

namespace py = pybind11;

namespace gossipcc {
namespace torch_backend {
namespace {

py::list EnvironmentVariablesList() {
  py::list out;
  for (const EnvironmentVariable& v : EnvironmentVariables()) {
    py::dict d;
    d["name"] = v.name;
    d["default"] = v.default_value;
    d["agree"] = v.must_agree;
    out.append(d);
  }
  return out;
}

py::list CheckEnvironmentList() {
  py::list out;
  for (const EnvironmentFinding& f : CheckEnvironment()) {
    py::dict d;
    d["name"] = f.name;
    d["value"] = f.value;
    d["error"] = f.error;
    d["note"] = f.note;
    out.append(d);
  }
  return out;
}

}  // namespace

void RegisterSettings(py::module_& m) {
  m.def("parse_allreduce_policy", [](const std::string& text) { return AllreducePolicy::Parse(text).ToString(); },
        "Validates an allreduce policy string and returns its normal form.");
  m.def("powersgd_policy_options",
        [](const std::string& text) {
          AllreducePolicy p = AllreducePolicy::Parse(text);
          if (p.kind != AllreducePolicy::Kind::kPowerSGD) throw InvalidArgumentError("not a powersgd policy: " + text);
          return p.powersgd.ToString();
        },
        "The PowerSGD options string of a \"powersgd:...\" policy.");
  m.def("environment_variables", &EnvironmentVariablesList,
        "Every environment variable the backend reads: [{name, default, agree}], as docs/pytorch.md lists them.");
  m.def("check_environment", &CheckEnvironmentList,
        "Every backend variable that is set, checked as creating a process group checks it: "
        "[{name, value, error (empty: valid), note}].");
}

}  // namespace torch_backend
}  // namespace gossipcc
