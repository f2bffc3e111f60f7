// gossipcc._C: the Python binding of the c10d backend. Thin: it constructs the process group
// and exposes gossipcc's own calls; every algorithm lives below torch_backend/.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "comm/errors.h"
#include "compression/power_sgd.h"
#include "torch_backend/tensor_buffer.h"
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

py::dict StatsToDict(const compression::PowerSGDStats& s) {
  py::dict d;
  d["calls"] = s.calls;
  d["tensors"] = s.tensors;
  d["compressed_tensors"] = s.compressed_tensors;
  d["elements_before"] = s.elements_before;
  d["elements_after"] = s.elements_after;
  d["bytes_before"] = s.bytes_before;
  d["bytes_after"] = s.bytes_after;
  d["check_bytes"] = s.check_bytes;
  d["allreduce_calls"] = s.allreduce_calls;
  d["nonfinite_calls"] = s.nonfinite_calls;
  d["compression_ratio"] = s.compression_ratio();
  return d;
}

void CheckKeys(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& keys) {
  if (tensors.size() != keys.size()) {
    throw InvalidArgumentError("gossipcc PowerSGD: " + std::to_string(tensors.size()) + " tensors but " +
                               std::to_string(keys.size()) + " keys (one stable key per tensor)");
  }
}

// PowerSGD over a process group's communicator, in place on `tensors` (each compressed with
// its own shape). Synchronous; the GIL is released while it runs.
compression::PowerSGDStats PowerSGDAllReduce(compression::PowerSGD& psgd, ProcessGroupGossipcc& pg,
                                             const std::vector<at::Tensor>& tensors,
                                             const std::vector<std::string>& keys) {
  CheckKeys(tensors, keys);
  std::vector<compression::GradientTensor> grads;
  grads.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    grads.push_back({keys[i], ToBuffer(t, "powersgd_allreduce", "tensor[" + std::to_string(i) + "]"),
                     std::vector<int64_t>(t.sizes().begin(), t.sizes().end())});
  }
  py::gil_scoped_release release;
  return psgd.AllReduce(pg.communicator(), grads);
}

compression::PowerSGDStats PowerSGDAllReduceFlat(compression::PowerSGD& psgd, ProcessGroupGossipcc& pg,
                                                 const std::vector<at::Tensor>& tensors,
                                                 const std::vector<std::string>& keys) {
  CheckKeys(tensors, keys);
  std::vector<compression::FlatGradient> flats;
  for (size_t i = 0; i < tensors.size(); ++i) {
    flats.push_back({keys[i], ToBuffer(tensors[i], "powersgd_allreduce_flat", "tensor[" + std::to_string(i) + "]")});
  }
  py::gil_scoped_release release;
  return psgd.AllReduceFlat(pg.communicator(), flats);
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
  m.def("powersgd_policy_options",
        [](const std::string& text) {
          AllreducePolicy p = AllreducePolicy::Parse(text);
          if (p.kind != AllreducePolicy::Kind::kPowerSGD) throw InvalidArgumentError("not a powersgd policy: " + text);
          return p.powersgd.ToString();
        },
        "The PowerSGD options string of a \"powersgd:...\" policy.");

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

  // PowerSGD state + collective (compression/power_sgd.h). Every rank makes one with the same
  // options and calls it with the same keys and shapes in the same order.
  py::class_<compression::PowerSGD>(m, "PowerSGD")
      .def(py::init([](const std::string& options) {
             return std::make_unique<compression::PowerSGD>(compression::ParsePowerSGDOptions(options));
           }),
           py::arg("options") = "", "options: \"rank=2,start_iter=10,...\" (docs/powersgd.md lists the keys)")
      .def_property_readonly("options", [](const compression::PowerSGD& p) { return p.options().ToString(); })
      .def("allreduce",
           [](compression::PowerSGD& p, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& tensors,
              const std::vector<std::string>& keys) { return StatsToDict(PowerSGDAllReduce(p, pg, tensors, keys)); }, py::arg("process_group"), py::arg("tensors"), py::arg("keys"),
           "Averages `tensors` (in place, each with its own shape) across the group with PowerSGD; returns stats.")
      .def("allreduce_flat",
           [](compression::PowerSGD& p, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& tensors,
              const std::vector<std::string>& keys) { return StatsToDict(PowerSGDAllReduceFlat(p, pg, tensors, keys)); }, py::arg("process_group"), py::arg("tensors"), py::arg("keys"),
           "As allreduce, for flat buffers (viewed as padded squares, like batched_powerSGD_hook).")
      .def_property_readonly("last_stats", [](const compression::PowerSGD& p) { return StatsToDict(p.last_stats()); })
      .def_property_readonly("total_stats", [](const compression::PowerSGD& p) { return StatsToDict(p.total_stats()); })
      .def("state_dict", [](const compression::PowerSGD& p) { return py::bytes(p.SaveState().Serialize()); },
           "Every key's error memory, Q and step counter, as bytes (for checkpoints).")
      .def("load_state_dict",
           [](compression::PowerSGD& p, const py::bytes& bytes) {
             p.LoadState(compression::PowerSGDCheckpoint::Deserialize(std::string(bytes)));
           },
           py::arg("state"));
}

}  // namespace torch_backend
}  // namespace gossipcc
