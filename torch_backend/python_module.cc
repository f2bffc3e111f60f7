// gossipcc._C: the Python binding of the c10d backend. Thin: it constructs the process group
// and exposes gossipcc's own calls; every algorithm lives below torch_backend/.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "comm/errors.h"
#include "torch_backend/process_group_gossipcc.h"

namespace py = pybind11;

namespace gossipcc {
namespace torch_backend {
namespace {

c10::intrusive_ptr<ProcessGroupGossipcc> CreateProcessGroup(const c10::intrusive_ptr<::c10d::Store>& store,
                                                            int rank, int size, std::chrono::milliseconds timeout,
                                                            const std::string& allreduce_policy) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgumentError("gossipcc: rank " + std::to_string(rank) + " is not in a world of size " +
                               std::to_string(size));
  }
  ProcessGroupOptions options;
  if (timeout.count() > 0) options.timeout = timeout;
  options.allreduce_policy = AllreducePolicy::Parse(allreduce_policy);
  py::gil_scoped_release release;  // rendezvous blocks until every rank arrives
  return c10::make_intrusive<ProcessGroupGossipcc>(store, rank, size, std::move(options));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gossipcc's c10d backend (C++ extension)";
  py::module::import("torch.distributed");  // registers c10d's Store and ProcessGroup/Backend types

  // Errors raised directly by this module's functions become these Python exceptions; the
  // ones raised inside torch's own bindings (dist.all_reduce) arrive as RuntimeError.
  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  py::register_exception<InvalidArgumentError>(m, "InvalidArgumentError", comm_error.ptr());
  py::register_exception<MismatchError>(m, "MismatchError", comm_error.ptr());
  py::register_exception<TimeoutError>(m, "TimeoutError", comm_error.ptr());
  py::register_exception<PeerError>(m, "PeerError", comm_error.ptr());
  py::register_exception<AbortedError>(m, "AbortedError", comm_error.ptr());

  m.attr("TORCH_HAS_BACKEND_CLASS") = kTorchHasBackendClass;
  m.def("parse_allreduce_policy", [](const std::string& text) { return AllreducePolicy::Parse(text).ToString(); },
        "Validates an allreduce policy string and returns its normal form.");

  py::class_<ProcessGroupGossipcc, C10dBackendBase, c10::intrusive_ptr<ProcessGroupGossipcc>>(
      m, "ProcessGroupGossipcc")
      .def(py::init(&CreateProcessGroup), py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("allreduce_policy") = "exact")
      .def_property_readonly("allreduce_policy",
                             [](const ProcessGroupGossipcc& pg) { return pg.options().allreduce_policy.ToString(); })
      .def("traffic",
           [](ProcessGroupGossipcc& pg) {
             TrafficCounters t = pg.communicator().traffic();
             py::dict d;
             d["collective_payload_bytes"] = t.collective_payload_bytes;
             d["p2p_bytes_sent"] = t.p2p_bytes_sent;
             d["p2p_bytes_received"] = t.p2p_bytes_received;
             return d;
           },
           "Bytes this rank handed to collectives and sent/received point to point.")
      .def("shutdown", &ProcessGroupGossipcc::shutdown, py::call_guard<py::gil_scoped_release>());
}

}  // namespace torch_backend
}  // namespace gossipcc
