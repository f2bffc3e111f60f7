// gossipcc._C's PowerSGD (compression/power_sgd.h): its state, its collective over a process
// group's communicator (synchronous, on the group's algorithm lane, the GIL released), its
// stats and checkpoints.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/core/errors.h"
#include "comm/core/types.h"
#include "compression/power_sgd.h"
#include "torch_backend/process_group_gossipcc.h"
#include "torch_backend/python_bindings.h"
#include "torch_backend/tensor_buffer.h"

namespace py = pybind11;

namespace gossipcc {
namespace torch_backend {
namespace {

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
  compression::PowerSGDStats stats;
  RunBlocking(pg, "PowerSGD.allreduce", [&] { stats = psgd.AllReduce(pg.communicator(), grads); });
  return stats;
}

// As PowerSGDAllReduce, for flat buffers (each viewed as a padded square).
compression::PowerSGDStats PowerSGDAllReduceFlat(compression::PowerSGD& psgd, ProcessGroupGossipcc& pg,
                                                 const std::vector<at::Tensor>& tensors,
                                                 const std::vector<std::string>& keys) {
  CheckKeys(tensors, keys);
  std::vector<compression::FlatGradient> flats;
  for (size_t i = 0; i < tensors.size(); ++i) {
    flats.push_back({keys[i], ToBuffer(tensors[i], "powersgd_allreduce_flat", "tensor[" + std::to_string(i) + "]")});
  }
  compression::PowerSGDStats stats;
  RunBlocking(pg, "PowerSGD.allreduce_flat", [&] { stats = psgd.AllReduceFlat(pg.communicator(), flats); });
  return stats;
}

// {key: (shape, dtype name, steps)} of a checkpoint's bytes.
py::dict CheckpointTensors(const py::bytes& bytes) {
  py::dict out;
  for (const auto& [key, t] : compression::PowerSGDCheckpoint::Deserialize(std::string(bytes)).tensors) {
    out[py::str(key)] = py::make_tuple(py::tuple(py::cast(t.shape)), DTypeName(t.dtype), t.steps);
  }
  return out;
}

}  // namespace

// Every rank makes one PowerSGD with the same options and calls it with the same keys and
// shapes in the same order.
void RegisterCompression(py::module_& m) {
  py::class_<compression::PowerSGD, std::shared_ptr<compression::PowerSGD>>(m, "PowerSGD")
      .def(py::init([](const std::string& options) {
             return std::make_shared<compression::PowerSGD>(compression::ParsePowerSGDOptions(options));
           }),
           py::arg("options") = "", "options: \"rank=2,start_iter=10,...\" (docs/powersgd.md lists the keys)")
      .def_property_readonly("options", [](const compression::PowerSGD& p) { return p.options().ToString(); })
      .def("allreduce",
           [](compression::PowerSGD& p, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& tensors,
              const std::vector<std::string>& keys) { return StatsToDict(PowerSGDAllReduce(p, pg, tensors, keys)); },
           py::arg("process_group"), py::arg("tensors"), py::arg("keys"),
           "Averages `tensors` (in place, each with its own shape) across the group with PowerSGD; returns stats.")
      .def("allreduce_flat",
           [](compression::PowerSGD& p, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& tensors,
              const std::vector<std::string>& keys) { return StatsToDict(PowerSGDAllReduceFlat(p, pg, tensors, keys)); },
           py::arg("process_group"), py::arg("tensors"), py::arg("keys"),
           "As allreduce, for flat buffers (viewed as padded squares, like batched_powerSGD_hook).")
      .def_property_readonly("last_stats", [](const compression::PowerSGD& p) { return StatsToDict(p.last_stats()); })
      .def_property_readonly("total_stats", [](const compression::PowerSGD& p) { return StatsToDict(p.total_stats()); })
      .def("state_dict", [](const compression::PowerSGD& p) { return py::bytes(p.SaveState().Serialize()); },
           "Every key's error memory, Q and step counter, as bytes (for checkpoints).")
      .def("load_state_dict",
           [](compression::PowerSGD& p, const py::bytes& bytes) {
             p.LoadState(compression::PowerSGDCheckpoint::Deserialize(std::string(bytes)));
           },
           py::arg("state"))
      .def_static("checkpoint_tensors", &CheckpointTensors, py::arg("state"),
                  "{key: (shape, dtype name, steps)} of a state_dict() byte string, to check it against a model before loading.");
}

}  // namespace torch_backend
}  // namespace gossipcc
