// gossipcc._C: the Python binding of the c10d backend. Thin: it constructs the process group
// and exposes gossipcc's own calls; every algorithm lives below torch_backend/.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <optional>

#include "algorithms/async_bilateral_exchange.h"
#include "algorithms/bilateral_exchange.h"
#include "algorithms/elastic_averaging.h"
#include "algorithms/fault_tolerant_push_sum.h"
#include "algorithms/peer_graph.h"
#include "algorithms/symmetric_gossip.h"
#include "algorithms/uneven_allreduce_sgd.h"
#include "comm/core/errors.h"
#include "compression/power_sgd.h"
#include "torch_backend/communicator_environment.h"
#include "torch_backend/process_group_gossipcc.h"
#include "torch_backend/tensor_buffer.h"

namespace py = pybind11;

namespace gossipcc {
namespace torch_backend {
namespace {

c10::intrusive_ptr<ProcessGroupGossipcc> CreateProcessGroup(const c10::intrusive_ptr<::c10d::Store>& store,
                                                            int rank, int size, std::chrono::milliseconds timeout,
                                                            const std::string& allreduce_policy,
                                                            std::optional<std::chrono::milliseconds> rendezvous_timeout,
                                                            const std::string& allreduce_policy_source) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgumentError("gossipcc: rank " + std::to_string(rank) + " is not in a world of size " +
                               std::to_string(size));
  }
  ProcessGroupOptions options;
  if (timeout.count() > 0) options.timeout = timeout;
  options.allreduce_policy = AllreducePolicy::Parse(allreduce_policy);
  options.allreduce_policy_source = allreduce_policy_source;
  // What init_process_group has left of its timeout (gossipcc/__init__.py): the rendezvous
  // ends within it. At least 1 ms, so that a late rank still gets a chance to connect.
  if (rendezvous_timeout) options.communicator.rendezvous_timeout = std::max(*rendezvous_timeout, std::chrono::milliseconds(1));
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
  compression::PowerSGDStats stats;
  pg.run_on_lane("gossipcc PowerSGD.allreduce", [&] { stats = psgd.AllReduce(pg.communicator(), grads); });
  return stats;
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
  compression::PowerSGDStats stats;
  pg.run_on_lane("gossipcc PowerSGD.allreduce_flat", [&] { stats = psgd.AllReduceFlat(pg.communicator(), flats); });
  return stats;
}

// A blocking algorithm call on the group's algorithm lane, with the GIL released.
void RunBlocking(ProcessGroupGossipcc& pg, const std::string& what, const std::function<void()>& fn) {
  py::gil_scoped_release release;
  pg.run_on_lane("gossipcc " + what + " on rank " + std::to_string(pg.getRank()), fn);
}

std::vector<at::Tensor> CheckedParams(const std::vector<at::Tensor>& tensors, const char* op,
                                      std::vector<Buffer>* buffers) {
  *buffers = FloatingBuffers(tensors, op);
  SyncCallerStreams(tensors);
  return tensors;
}

at::Tensor DoublesToTensor(const std::vector<double>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(at::kDouble));
  std::copy(v.begin(), v.end(), t.data_ptr<double>());
  return t;
}

std::vector<double> TensorToDoubles(const at::Tensor& t, const char* what) {
  if (!t.defined() || t.dim() != 1) throw InvalidArgumentError(std::string(what) + " must be a 1-D tensor");
  at::Tensor c = t.to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

std::unique_ptr<PeerGraph> GraphForQuery(const std::string& spec, int n) {
  if (n < 1) throw InvalidArgumentError("world size must be >= 1, got " + std::to_string(n));
  return MakePeerGraph(spec, n);
}

void CheckQuery(int n, int rank, int64_t step) {
  if (n < 1 || rank < 0 || rank >= n) {
    throw InvalidArgumentError("rank " + std::to_string(rank) + " is not in a world of size " + std::to_string(n));
  }
  if (step < 0) throw InvalidArgumentError("step must be >= 0, got " + std::to_string(step));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gossipcc's c10d backend (C++ extension)";
  py::module::import("torch.distributed");  // registers c10d's Store and ProcessGroup/Backend types

  // Errors raised directly by this module's functions become these Python exceptions; the
  // ones raised inside torch's own bindings (dist.all_reduce) arrive as RuntimeError.
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

  // Shutting a process group down (also from its destructor, which Python may run with the
  // GIL held) joins threads that may need the GIL: release it for that time.
  SetBlockingRegionFactory([]() -> std::shared_ptr<void> {
    if (!Py_IsInitialized() || !PyGILState_Check()) return nullptr;
    return std::make_shared<py::gil_scoped_release>();
  });

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
  m.def("environment_variables",
        [] {
          py::list out;
          for (const EnvironmentVariable& v : EnvironmentVariables()) {
            py::dict d;
            d["name"] = v.name;
            d["default"] = v.default_value;
            d["agree"] = v.must_agree;
            out.append(d);
          }
          return out;
        },
        "Every environment variable the backend reads: [{name, default, agree}], as docs/pytorch.md lists them.");
  m.def("check_environment",
        [] {
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
        },
        "Every backend variable that is set, checked as creating a process group checks it: "
        "[{name, value, error (empty: valid), note}].");

  py::class_<ProcessGroupGossipcc, C10dBackendBase, c10::intrusive_ptr<ProcessGroupGossipcc>>(
      m, "ProcessGroupGossipcc")
      .def(py::init(&CreateProcessGroup), py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("allreduce_policy") = "exact", py::arg("rendezvous_timeout") = py::none(),
           py::arg("allreduce_policy_source") = "")
      .def_property_readonly("allreduce_policy",
                             [](const ProcessGroupGossipcc& pg) { return pg.options().allreduce_policy.ToString(); })
      .def_property_readonly(
          "allreduce_policy_source",
          [](const ProcessGroupGossipcc& pg) { return pg.options().allreduce_policy_source; },
          "Where the policy came from: \"GOSSIPCC_ALLREDUCE\", \"gossipcc.configure(allreduce=...)\" or \"\".")
      .def("traffic",
           [](ProcessGroupGossipcc& pg) {
             TrafficCounters t = pg.communicator().traffic();
             py::dict d;
             d["collective_payload_bytes"] = t.collective_payload_bytes;
             d["p2p_bytes_sent"] = t.p2p_bytes_sent;
             d["p2p_bytes_received"] = t.p2p_bytes_received;
             d["packed_allreduce_raw_bytes"] = t.packed_allreduce_raw_bytes;
             d["packed_allreduce_wire_bytes"] = t.packed_allreduce_wire_bytes;
             return d;
           },
           "Bytes this rank handed to collectives, sent/received point to point, and the packed "
           "all-reduce's float32 bytes and what it sent for them.")
      .def("topology",
           [](ProcessGroupGossipcc& pg) {
             const Topology& t = pg.communicator().topology();
             py::dict d;
             py::list hosts;
             for (int h = 0; h < t.hosts(); ++h) hosts.append(py::cast(t.ranks_on_host(h)));
             d["hosts"] = hosts;
             d["description"] = t.Describe();
             d["hierarchical"] = pg.communicator().hierarchical();
             return d;
           },
           "Which ranks share a host (a list of each host's ranks, hosts in the order of their "
           "lowest rank), and whether large all-reduces run in two levels over them "
           "(GOSSIPCC_TOPOLOGY).")
      .def("shutdown", &ProcessGroupGossipcc::shutdown, py::call_guard<py::gil_scoped_release>())
      .def_property("order_nested_collectives", &ProcessGroupGossipcc::order_nested_collectives,
                    &ProcessGroupGossipcc::set_order_nested_collectives,
                    "Collectives issued inside completion callbacks go before any issued later by another "
                    "thread (set by gossipcc when torch's PowerSGD hooks are registered; every rank alike)")
      // gossipcc's own collectives (process_group_gossipcc.h documents the contract).
      .def("push_sum_round", &ProcessGroupGossipcc::push_sum_round, py::arg("tensors"), py::arg("weight"),
           py::arg("step"), py::arg("graph") = "exponential", py::arg("keep") = py::none(),
           py::call_guard<py::gil_scoped_release>(),
           "One push-sum round (SGP) in place on `tensors` (this rank's numerator x) and `weight` (1-element "
           "float64 CPU tensor). graph: peer graph spec; keep: share kept (None: uniform). Returns a Work whose "
           "future holds tensors + [weight].")
      .def("symmetric_gossip_round", &ProcessGroupGossipcc::symmetric_gossip_round, py::arg("tensors"),
           py::arg("step"), py::arg("graph") = "ring", py::call_guard<py::gil_scoped_release>(),
           "One symmetric gossip round (D-PSGD, Metropolis weights) in place. Returns a Work.")
      .def("bilateral_exchange", &ProcessGroupGossipcc::bilateral_exchange, py::arg("tensors"), py::arg("step"),
           py::arg("matching") = "round_robin", py::call_guard<py::gil_scoped_release>(),
           "One synchronous bilateral exchange (pairwise averaging). matching: \"round_robin\", \"bipartite\" "
           "or a graph spec whose steps are matchings. Returns a Work.")
      .def("async_bilateral_exchange", &ProcessGroupGossipcc::async_bilateral_exchange, py::arg("tensors"),
           py::call_guard<py::gil_scoped_release>(),
           "Active (odd) ranks: one AD-PSGD exchange with the next passive peer (CPU tensors). The peer: "
           "work._source_rank() (or source_rank()) after completion, or async_bilateral_stats()['last_peer'].")
      .def("async_bilateral_serve", &ProcessGroupGossipcc::async_bilateral_serve, py::arg("tensors"),
           py::arg("max_requests") = -1, py::call_guard<py::gil_scoped_release>(),
           "Passive (even) ranks: answer up to max_requests exchanges (-1: until every active rank finished).")
      .def("async_bilateral_finish", &ProcessGroupGossipcc::async_bilateral_finish, py::arg("tensors"),
           py::call_guard<py::gil_scoped_release>(),
           "Active ranks, once at the end: tell the passive peers no more requests come.")
      .def("async_bilateral_stats",
           [](const ProcessGroupGossipcc& pg) {
             auto s = pg.async_bilateral_stats();
             py::dict d;
             d["exchanges"] = s.exchanges;
             d["last_peer"] = s.last_peer;
             d["all_active_finished"] = s.all_active_finished;
             return d;
           },
           "{'exchanges', 'last_peer', 'all_active_finished'} of the completed asynchronous bilateral calls.")
      .def("async_bilateral_restore", &ProcessGroupGossipcc::async_bilateral_restore, py::arg("exchanges"),
           py::call_guard<py::gil_scoped_release>(),
           "Sets the asynchronous exchange's request counter (a checkpoint's peer-schedule position). Returns a Work.")
      .def("powersgd_allreduce",
           [](ProcessGroupGossipcc& pg, std::vector<at::Tensor> tensors,
              std::optional<std::vector<std::optional<std::vector<int64_t>>>> shapes,
              std::shared_ptr<compression::PowerSGD> state, std::optional<std::vector<std::string>> keys) {
             // shapes None: every tensor's own shape; shapes[i] None: tensor i's own shape.
             std::vector<std::vector<int64_t>> resolved;
             if (shapes) {
               if (shapes->size() != tensors.size()) {
                 throw InvalidArgumentError("gossipcc powersgd_allreduce: " + std::to_string(tensors.size()) +
                                            " tensors but " + std::to_string(shapes->size()) + " shapes");
               }
               for (size_t i = 0; i < shapes->size(); ++i) {
                 const auto& shape = (*shapes)[i];
                 resolved.push_back(shape ? *shape
                                          : std::vector<int64_t>(tensors[i].sizes().begin(), tensors[i].sizes().end()));
               }
             }
             return pg.powersgd_allreduce(std::move(tensors), std::move(resolved), std::move(state),
                                          keys ? std::move(*keys) : std::vector<std::string>{});
           },
           py::arg("tensors"), py::arg("shapes"), py::arg("state"), py::arg("keys") = py::none(),
           py::call_guard<py::gil_scoped_release>(),
           "PowerSGD all-reduce (average) in place over `tensors`, each compressed as shapes[i] (None: own "
           "shapes), state in `state` (gossipcc._C.PowerSGD) under keys[i] (None: 'tensor<i>'). Returns a Work.")
      .def("quantized_allreduce", &ProcessGroupGossipcc::quantized_allreduce, py::arg("tensors"), py::arg("bits") = 8,
           py::arg("average") = true, py::arg("residual") = py::none(), py::arg("owned_residual") = py::none(),
           py::arg("block_size") = 256, py::call_guard<py::gil_scoped_release>(),
           "Lossy all-reduce (average, or sum with average=False) of `tensors` (together one float32 CPU vector) in "
           "place, sent as `bits` (8 or 4) per element plus a float32 scale per block_size elements; the same bits "
           "on every rank (compression/quantized_allreduce.h states the error bound). Error feedback: residual and "
           "owned_residual, float32 CPU tensors of the total element count (zeros at first), updated in place. "
           "Bad arguments or ranks that disagree fail the Work on every rank. Returns a Work.")
      .def("fault_tolerant_push_sum", &ProcessGroupGossipcc::fault_tolerant_push_sum, py::arg("graph") = "exponential",
           py::call_guard<py::gil_scoped_release>(),
           "Collective: a FaultTolerantPushSum state (push-sum that survives dead peers) over this group's ranks, "
           "with a communicator of its own rendezvoused through the group's store (which must survive).")
      .def("fault_tolerant_push_sum_round", &ProcessGroupGossipcc::fault_tolerant_push_sum_round, py::arg("tensors"),
           py::arg("state"), py::call_guard<py::gil_scoped_release>(),
           "One fault-tolerant push-sum round of `state` in place on `tensors` (this rank's numerator x; CPU "
           "float32/float64); a peer failure makes it recover instead (state.epoch grows). Returns a Work.");

  // The state of a fault-tolerant push-sum (algorithms/fault_tolerant_push_sum.h), made by
  // ProcessGroupGossipcc.fault_tolerant_push_sum. Read it only while no round is in flight.
  py::class_<FaultTolerantPushSum, std::shared_ptr<FaultTolerantPushSum>>(m, "FaultTolerantPushSum")
      .def_property_readonly("weight", &FaultTolerantPushSum::weight, "This rank's push-sum weight w.")
      .def_property_readonly("step", &FaultTolerantPushSum::step,
                             "Steps taken (Step calls; equal on every survivor that made the same calls).")
      .def_property_readonly("round", &FaultTolerantPushSum::round, "Exchange rounds (settling included).")
      .def_property_readonly("epoch", &FaultTolerantPushSum::epoch, "Recoveries so far.")
      .def_property_readonly("rank", &FaultTolerantPushSum::rank, "This rank (original).")
      .def_property_readonly("members", &FaultTolerantPushSum::members, "Original ranks alive, ascending.")
      .def_property_readonly("dead", &FaultTolerantPushSum::dead, "Original ranks dropped as dead so far, ascending.")
      .def_property_readonly("departed", &FaultTolerantPushSum::departed,
                             "Original ranks that left on purpose (leave) so far, ascending.")
      .def_property_readonly("has_left", &FaultTolerantPushSum::has_left, "Whether this rank left (leave).")
      .def("leave", &FaultTolerantPushSum::Leave, py::call_guard<py::gil_scoped_release>(),
           "Leaves on purpose: marks this rank as left in the store, then closes its connections; the others "
           "drop it as departed, not dead. Idempotent; later rounds raise ValueError.")
      .def_property_readonly("last_recovery",
                             [](const FaultTolerantPushSum& ps) {
                               const RecoveryReport& r = ps.last_recovery();
                               py::dict d;
                               d["epoch"] = r.epoch;
                               d["dead"] = r.dead;
                               d["departed"] = r.departed;
                               d["members"] = r.members;
                               d["step"] = r.step;
                               d["weight_correction"] = r.weight_correction;
                               return d;
                             },
                             "{'epoch', 'dead', 'departed', 'members', 'step', 'weight_correction'} of the last recovery.")
      .def("average",
           [](std::shared_ptr<FaultTolerantPushSum> ps, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& x,
              const at::Tensor& out) {
             std::vector<Buffer> b;
             auto keep = CheckedParams(x, "FaultTolerantPushSum.average", &b);
             Buffer o = ToBuffer(out, "FaultTolerantPushSum.average", "out");
             RunBlocking(pg, "FaultTolerantPushSum.average", [&] { ps->Average(b, o); });
           },
           py::arg("process_group"), py::arg("x"), py::arg("out"),
           "Collective over the members: out <- sum x / sum w (bitwise equal everywhere); x, w unchanged.")
      .def("mean_over_members",
           [](std::shared_ptr<FaultTolerantPushSum> ps, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& tensors) {
             std::vector<Buffer> b;
             auto keep = CheckedParams(tensors, "FaultTolerantPushSum.mean_over_members", &b);
             RunBlocking(pg, "FaultTolerantPushSum.mean_over_members", [&] { ps->MeanOverMembers(b); });
           },
           py::arg("process_group"), py::arg("tensors"),
           "Collective over the members: each tensor <- the members' mean (in place, bitwise equal everywhere).");

  // Peer graphs and matchings as the collectives use them (for references in tests and tools).
  m.def("peer_graph_out_peers",
        [](const std::string& spec, int n, int rank, int64_t step) {
          CheckQuery(n, rank, step);
          return GraphForQuery(spec, n)->OutPeers(rank, step);
        },
        py::arg("spec"), py::arg("world_size"), py::arg("rank"), py::arg("step"));
  m.def("peer_graph_in_peers",
        [](const std::string& spec, int n, int rank, int64_t step) {
          CheckQuery(n, rank, step);
          return GraphForQuery(spec, n)->InPeers(rank, step);
        },
        py::arg("spec"), py::arg("world_size"), py::arg("rank"), py::arg("step"));
  m.def("peer_graph_info",
        [](const std::string& spec, int n) {
          auto g = GraphForQuery(spec, n);
          py::dict d;
          d["name"] = g->name();
          d["period"] = g->period();
          return d;
        },
        py::arg("spec"), py::arg("world_size"), "Validates a graph spec: {'name', 'period'}.");
  m.def("peer_graph_directed_step",
        [](const std::string& spec, int n, int64_t max_steps) -> py::object {
          auto g = GraphForQuery(spec, n);
          const int64_t steps = std::min<int64_t>(g->period(), max_steps);
          for (int64_t step = 0; step < steps; ++step) {
            if (!g->IsSymmetricAt(step)) return py::int_(step);
          }
          return py::none();
        },
        py::arg("spec"), py::arg("world_size"), py::arg("max_steps"),
        "The first step below min(period, max_steps) at which the graph is directed (PeerGraph::IsSymmetricAt), "
        "or None.");
  m.def("symmetric_gossip_weights",
        [](const std::string& spec, int n, int rank, int64_t step) {
          CheckQuery(n, rank, step);
          SymmetricGossip g(GraphForQuery(spec, n));
          return g.Weights(rank, step);
        },
        py::arg("spec"), py::arg("world_size"), py::arg("rank"), py::arg("step"),
        "Metropolis weights [self, one per out-peer in peer_graph_out_peers order].");
  m.def("bilateral_partner",
        [](const std::string& matching, int n, int rank, int64_t step) {
          CheckQuery(n, rank, step);
          if (matching == "round_robin") return BilateralExchange::RoundRobinPartner(rank, step, n);
          if (matching == "bipartite") return BilateralExchange::BipartitePartner(rank, step, n);
          BilateralExchange ex(std::shared_ptr<const PeerGraph>(GraphForQuery(matching, n)));
          return ex.Partner(rank, step, n);
        },
        py::arg("matching"), py::arg("world_size"), py::arg("rank"), py::arg("step"), "Partner at step, -1: idle.");
  m.def("async_bilateral_passive_peers", &AsyncBilateralExchange::PassivePeers, py::arg("rank"),
        py::arg("world_size"), "The passive peers an active rank cycles through.");

  // Elastic averaging (algorithms/elastic_averaging.h), blocking, over a process group.
  py::class_<ElasticAveraging, std::shared_ptr<ElasticAveraging>>(m, "ElasticAveraging")
      .def(py::init([](int tau, double alpha) { return std::make_shared<ElasticAveraging>(tau, alpha); }),
           py::arg("tau"), py::arg("alpha"))
      .def_property_readonly("tau", &ElasticAveraging::tau)
      .def_property_readonly("alpha", &ElasticAveraging::alpha)
      .def_property_readonly("local_step", &ElasticAveraging::step)
      .def_property_readonly("center", [](const ElasticAveraging& e) { return DoublesToTensor(e.center()); })
      .def("initialize",
           [](std::shared_ptr<ElasticAveraging> e, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& params) {
             std::vector<Buffer> b;
             auto keep = CheckedParams(params, "ElasticAveraging.initialize", &b);
             RunBlocking(pg, "ElasticAveraging.initialize", [&] { e->Initialize(pg.communicator(), b); });
           },
           py::arg("process_group"), py::arg("params"),
           "Collective: params <- rank 0's, center <- params, step <- 0.")
      .def("step",
           [](std::shared_ptr<ElasticAveraging> e, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& params) {
             std::vector<Buffer> b;
             auto keep = CheckedParams(params, "ElasticAveraging.step", &b);
             bool averaged = false;
             RunBlocking(pg, "ElasticAveraging.step", [&] { averaged = e->Step(pg.communicator(), b); });
             return averaged;
           },
           py::arg("process_group"), py::arg("params"),
           "Once per local step after the optimizer step; averages every tau steps (returns True then).")
      .def("average",
           [](std::shared_ptr<ElasticAveraging> e, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& params) {
             std::vector<Buffer> b;
             auto keep = CheckedParams(params, "ElasticAveraging.average", &b);
             RunBlocking(pg, "ElasticAveraging.average", [&] { e->Average(pg.communicator(), b); });
           },
           py::arg("process_group"), py::arg("params"), "One elastic averaging now (collective).")
      .def("state_dict",
           [](const ElasticAveraging& e) {
             py::dict d;
             d["tau"] = e.tau();
             d["alpha"] = e.alpha();
             d["step"] = e.step();
             d["center"] = DoublesToTensor(e.center());
             return d;
           })
      .def("load_state_dict",
           [](ElasticAveraging& e, const py::dict& d) {
             for (const char* k : {"tau", "alpha", "step", "center"}) {
               if (!d.contains(k)) throw InvalidArgumentError(std::string("ElasticAveraging.load_state_dict: missing key '") + k + "'");
             }
             if (d["tau"].cast<int>() != e.tau() || d["alpha"].cast<double>() != e.alpha()) {
               throw InvalidArgumentError("ElasticAveraging.load_state_dict: the state has tau=" +
                                          std::to_string(d["tau"].cast<int>()) + ", alpha=" +
                                          std::to_string(d["alpha"].cast<double>()) + " but this object tau=" +
                                          std::to_string(e.tau()) + ", alpha=" + std::to_string(e.alpha()));
             }
             e.Restore(d["step"].cast<int64_t>(), TensorToDoubles(d["center"].cast<at::Tensor>(), "center"));
           },
           py::arg("state"));

  // All-reduce SGD with uneven steps (algorithms/uneven_allreduce_sgd.h), blocking.
  py::class_<UnevenAllReduceSGD, std::shared_ptr<UnevenAllReduceSGD>>(m, "UnevenAllReduceSGD")
      .def(py::init([]() { return std::make_shared<UnevenAllReduceSGD>(); }))
      .def("sum_and_normalize",
           [](std::shared_ptr<UnevenAllReduceSGD> u, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& grads) {
             std::vector<Buffer> b;
             auto keep = CheckedParams(grads, "UnevenAllReduceSGD.sum_and_normalize", &b);
             UnevenAllReduceSGD::StepResult r;
             RunBlocking(pg, "UnevenAllReduceSGD.sum_and_normalize",
                         [&] { r = u->SumAndNormalizeGradients(pg.communicator(), b); });
             return py::make_tuple(r.contributors, r.still_training);
           },
           py::arg("process_group"), py::arg("grads"),
           "Collective: grads <- sum over contributing ranks / contributors; returns (contributors, still_training).")
      .def("join_until_all_done",
           [](std::shared_ptr<UnevenAllReduceSGD> u, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& grads) {
             std::vector<Buffer> b;
             auto keep = CheckedParams(grads, "UnevenAllReduceSGD.join_until_all_done", &b);
             bool more = false;
             RunBlocking(pg, "UnevenAllReduceSGD.join_until_all_done",
                         [&] { more = u->JoinUntilAllDone(pg.communicator(), b); });
             return more;
           },
           py::arg("process_group"), py::arg("grads"),
           "Collective, for a finished rank: call until it returns False (grads: scratch of the same sizes).")
      .def("synchronize_parameters",
           [](std::shared_ptr<UnevenAllReduceSGD> u, ProcessGroupGossipcc& pg, const std::vector<at::Tensor>& params) {
             std::vector<Buffer> b;
             auto keep = CheckedParams(params, "UnevenAllReduceSGD.synchronize_parameters", &b);
             int winner = 0;
             RunBlocking(pg, "UnevenAllReduceSGD.synchronize_parameters",
                         [&] { winner = u->SynchronizeParameters(pg.communicator(), b); });
             return winner;
           },
           py::arg("process_group"), py::arg("params"),
           "Collective: params <- those of the rank with the most steps since the last synchronisation "
           "(highest rank among ties), bitwise on every rank; returns that rank.")
      .def_static("winner", &UnevenAllReduceSGD::Winner, py::arg("steps_per_rank"),
                  "The rank synchronize_parameters picks for these step counts (index = rank).")
      .def_property_readonly("steps_contributed", &UnevenAllReduceSGD::steps_contributed)
      .def_property_readonly("collectives", &UnevenAllReduceSGD::collectives)
      .def_property_readonly("steps_since_sync", &UnevenAllReduceSGD::steps_since_sync)
      .def("state_dict",
           [](const UnevenAllReduceSGD& u) {
             py::dict d;
             d["steps_contributed"] = u.steps_contributed();
             d["collectives"] = u.collectives();
             d["steps_since_sync"] = u.steps_since_sync();
             return d;
           })
      .def("load_state_dict",
           [](UnevenAllReduceSGD& u, const py::dict& d) {
             for (const char* k : {"steps_contributed", "collectives"}) {
               if (!d.contains(k)) throw InvalidArgumentError(std::string("UnevenAllReduceSGD.load_state_dict: missing key '") + k + "'");
             }
             const int64_t steps = d["steps_contributed"].cast<int64_t>();
             // States saved before steps_since_sync existed: AllReduceSGD synchronises once, at
             // finish(), so until then every contributed step is one since the last synchronisation.
             const int64_t since = d.contains("steps_since_sync") ? d["steps_since_sync"].cast<int64_t>() : steps;
             u.Restore(steps, d["collectives"].cast<int64_t>(), since);
           },
           py::arg("state"));

  // PowerSGD state + collective (compression/power_sgd.h). Every rank makes one with the same
  // options and calls it with the same keys and shapes in the same order.
  py::class_<compression::PowerSGD, std::shared_ptr<compression::PowerSGD>>(m, "PowerSGD")
      .def(py::init([](const std::string& options) {
             return std::make_shared<compression::PowerSGD>(compression::ParsePowerSGDOptions(options));
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
           py::arg("state"))
      .def_static(
          "checkpoint_tensors",
          [](const py::bytes& bytes) {
            py::dict out;
            for (const auto& [key, t] : compression::PowerSGDCheckpoint::Deserialize(std::string(bytes)).tensors) {
              out[py::str(key)] = py::make_tuple(py::tuple(py::cast(t.shape)), DTypeName(t.dtype), t.steps);
            }
            return out;
          },
          py::arg("state"),
          "{key: (shape, dtype name, steps)} of a state_dict() byte string, to check it against a model before loading.");
}

}  // namespace torch_backend
}  // namespace gossipcc
