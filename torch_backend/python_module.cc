// gossipcc._C: the Python binding of the c10d backend. Thin: it constructs the process group
// and exposes gossipcc's own calls; every algorithm lives below torch_backend/. This file is
// the module's entry (its exception types and the blocking region); each topic's bindings are
// in a file of their own (python_bindings.h).
#include <pybind11/pybind11.h>

#include <exception>
#include <memory>

#include "comm/core/errors.h"
#include "torch_backend/process_group_gossipcc.h"
#include "torch_backend/python_bindings.h"
#include "torch_backend/torch_version.h"

namespace py = pybind11;

namespace gossipcc {
namespace torch_backend {
namespace {

// Errors raised directly by this module's functions become these Python exceptions; the
// ones raised inside torch's own bindings (dist.all_reduce) arrive as RuntimeError.
void RegisterExceptions(py::module_& m) {
  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  // InvalidArgumentError is both a CommError and a ValueError (bad arguments, raised at the call).
  {
    PyObject* bases = PyTuple_Pack(2, comm_error.ptr(), PyExc_ValueError);
    static PyObject* invalid = PyErr_NewException("gossipcc._C.InvalidArgumentError", bases, nullptr);
    Py_DECREF(bases);
    if (!invalid) throw py::error_already_set();
    m.attr("InvalidArgumentError") = py::handle(invalid);
    py::register_exception_translator([](std::exception_ptr p) {
      try {
        if (p) std::rethrow_exception(p);
      } catch (const InvalidArgumentError& e) {
        PyErr_SetString(invalid, e.what());
      }
    });
  }
  py::register_exception<MismatchError>(m, "MismatchError", comm_error.ptr());
  py::register_exception<TimeoutError>(m, "TimeoutError", comm_error.ptr());
  py::register_exception<PeerError>(m, "PeerError", comm_error.ptr());
  py::register_exception<AbortedError>(m, "AbortedError", comm_error.ptr());
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gossipcc's c10d backend (C++ extension)";
  py::module::import("torch.distributed");  // registers c10d's Store and ProcessGroup/Backend types

  RegisterExceptions(m);

  // Shutting a process group down (also from its destructor, which Python may run with the
  // GIL held) joins threads that may need the GIL: release it for that time.
  SetBlockingRegionFactory([]() -> std::shared_ptr<void> {
    if (!Py_IsInitialized() || !PyGILState_Check()) return nullptr;
    return std::make_shared<py::gil_scoped_release>();
  });

  m.attr("TORCH_HAS_BACKEND_CLASS") = kTorchHasBackendClass;
  RegisterSettings(m);
  RegisterProcessGroup(m);
  RegisterAlgorithms(m);
  RegisterCompression(m);
}

}  // namespace torch_backend
}  // namespace gossipcc
