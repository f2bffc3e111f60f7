// ProcessGroupGossipcc in Python: its construction from c10d's arguments and the calls that are
// gossipcc's own (process_group_gossipcc.h documents their contract). The c10d collectives come
// from the base class that torch binds.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/fault_tolerant_push_sum.h"
#include "comm/core/errors.h"
#include "compression/power_sgd.h"
#include "torch_backend/process_group_gossipcc.h"
#include "torch_backend/python_bindings.h"

namespace py = pybind11;

namespace gossipcc {
namespace torch_backend {
namespace {

using PyProcessGroup = py::class_<ProcessGroupGossipcc, C10dBackendBase, c10::intrusive_ptr<ProcessGroupGossipcc>>;

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

py::dict TrafficDict(ProcessGroupGossipcc& pg) {
  TrafficCounters t = pg.communicator().traffic();
  py::dict d;
  d["collective_payload_bytes"] = t.collective_payload_bytes;
  d["p2p_bytes_sent"] = t.p2p_bytes_sent;
  d["p2p_bytes_received"] = t.p2p_bytes_received;
  d["packed_allreduce_raw_bytes"] = t.packed_allreduce_raw_bytes;
  d["packed_allreduce_wire_bytes"] = t.packed_allreduce_wire_bytes;
  return d;
}

py::dict TopologyDict(ProcessGroupGossipcc& pg) {
  const Topology& t = pg.communicator().topology();
  py::dict d;
  py::list hosts;
  for (int h = 0; h < t.hosts(); ++h) hosts.append(py::cast(t.ranks_on_host(h)));
  d["hosts"] = hosts;
  d["description"] = t.Describe();
  d["hierarchical"] = pg.communicator().hierarchical();
  return d;
}

py::dict AsyncBilateralStatsDict(ProcessGroupGossipcc& pg) {
  auto s = pg.gossip().async_bilateral_stats();
  py::dict d;
  d["exchanges"] = s.exchanges;
  d["last_peer"] = s.last_peer;
  d["all_active_finished"] = s.all_active_finished;
  return d;
}

// A method of GossipCollectives as a method of the process group (the Python API is on it).
template <typename R, typename... Args>
std::function<R(ProcessGroupGossipcc&, Args...)> OnGossip(R (GossipCollectives::*method)(Args...)) {
  return [method](ProcessGroupGossipcc& pg, Args... args) { return (pg.gossip().*method)(std::move(args)...); };
}

// powersgd_allreduce's shapes: empty for None (every tensor's own shape); shapes[i] None: tensor
// i's own shape.
std::vector<std::vector<int64_t>> ResolveShapes(const std::vector<at::Tensor>& tensors,
                                                const std::optional<std::vector<std::optional<std::vector<int64_t>>>>& shapes) {
  std::vector<std::vector<int64_t>> resolved;
  if (!shapes) return resolved;
  if (shapes->size() != tensors.size()) {
    throw InvalidArgumentError("gossipcc powersgd_allreduce: " + std::to_string(tensors.size()) + " tensors but " +
                               std::to_string(shapes->size()) + " shapes");
  }
  for (size_t i = 0; i < shapes->size(); ++i) {
    const auto& shape = (*shapes)[i];
    resolved.push_back(shape ? *shape : std::vector<int64_t>(tensors[i].sizes().begin(), tensors[i].sizes().end()));
  }
  return resolved;
}

// Construction, the policy, counters and topology, shutdown and the ordering switch.
void DefineBasics(PyProcessGroup& cls) {
  cls.def(py::init(&CreateProcessGroup), py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
          py::arg("allreduce_policy") = "exact", py::arg("rendezvous_timeout") = py::none(),
          py::arg("allreduce_policy_source") = "")
      .def_property_readonly("allreduce_policy",
                             [](const ProcessGroupGossipcc& pg) { return pg.options().allreduce_policy.ToString(); })
      .def_property_readonly(
          "allreduce_policy_source",
          [](const ProcessGroupGossipcc& pg) { return pg.options().allreduce_policy_source; },
          "Where the policy came from: \"GOSSIPCC_ALLREDUCE\", \"gossipcc.configure(allreduce=...)\" or \"\".")
      .def("traffic", &TrafficDict,
           "Bytes this rank handed to collectives, sent/received point to point, and the packed "
           "all-reduce's float32 bytes and what it sent for them.")
      .def("topology", &TopologyDict,
           "Which ranks share a host (a list of each host's ranks, hosts in the order of their "
           "lowest rank), and whether large all-reduces run in two levels over them "
           "(GOSSIPCC_TOPOLOGY).")
      .def("shutdown", &ProcessGroupGossipcc::shutdown, py::call_guard<py::gil_scoped_release>())
      .def_property("order_nested_collectives", &ProcessGroupGossipcc::order_nested_collectives,
                    &ProcessGroupGossipcc::set_order_nested_collectives,
                    "Collectives issued inside completion callbacks go before any issued later by another "
                    "thread (set by gossipcc when torch's PowerSGD hooks are registered; every rank alike)");
}

// The gossip rounds: push-sum, symmetric gossip, bilateral exchange (sync and async).
void DefineGossipRounds(PyProcessGroup& cls) {
  cls.def("push_sum_round", OnGossip(&GossipCollectives::push_sum_round), py::arg("tensors"), py::arg("weight"),
          py::arg("step"), py::arg("graph") = "exponential", py::arg("keep") = py::none(),
          py::call_guard<py::gil_scoped_release>(),
          "One push-sum round (SGP) in place on `tensors` (this rank's numerator x) and `weight` (1-element "
          "float64 CPU tensor). graph: peer graph spec; keep: share kept (None: uniform). Returns a Work whose "
          "future holds tensors + [weight].")
      .def("symmetric_gossip_round", OnGossip(&GossipCollectives::symmetric_gossip_round), py::arg("tensors"),
           py::arg("step"), py::arg("graph") = "ring", py::call_guard<py::gil_scoped_release>(),
           "One symmetric gossip round (D-PSGD, Metropolis weights) in place. Returns a Work.")
      .def("bilateral_exchange", OnGossip(&GossipCollectives::bilateral_exchange), py::arg("tensors"), py::arg("step"),
           py::arg("matching") = "round_robin", py::call_guard<py::gil_scoped_release>(),
           "One synchronous bilateral exchange (pairwise averaging). matching: \"round_robin\", \"bipartite\" "
           "or a graph spec whose steps are matchings. Returns a Work.")
      .def("async_bilateral_exchange", OnGossip(&GossipCollectives::async_bilateral_exchange), py::arg("tensors"),
           py::call_guard<py::gil_scoped_release>(),
           "Active (odd) ranks: one AD-PSGD exchange with the next passive peer (CPU tensors). The peer: "
           "work._source_rank() (or source_rank()) after completion, or async_bilateral_stats()['last_peer'].")
      .def("async_bilateral_serve", OnGossip(&GossipCollectives::async_bilateral_serve), py::arg("tensors"),
           py::arg("max_requests") = -1, py::call_guard<py::gil_scoped_release>(),
           "Passive (even) ranks: answer up to max_requests exchanges (-1: until every active rank finished).")
      .def("async_bilateral_finish", OnGossip(&GossipCollectives::async_bilateral_finish), py::arg("tensors"),
           py::call_guard<py::gil_scoped_release>(),
           "Active ranks, once at the end: tell the passive peers no more requests come.")
      .def("async_bilateral_stats", &AsyncBilateralStatsDict,
           "{'exchanges', 'last_peer', 'all_active_finished'} of the completed asynchronous bilateral calls.")
      .def("async_bilateral_restore", OnGossip(&GossipCollectives::async_bilateral_restore), py::arg("exchanges"),
           py::call_guard<py::gil_scoped_release>(),
           "Sets the asynchronous exchange's request counter (a checkpoint's peer-schedule position). Returns a Work.");
}

// The compressed all-reduces (PowerSGD, quantized) and the fault-tolerant push-sum.
void DefineCompressedAndFaultTolerant(PyProcessGroup& cls) {
  cls.def("powersgd_allreduce",
          [](ProcessGroupGossipcc& pg, std::vector<at::Tensor> tensors,
             std::optional<std::vector<std::optional<std::vector<int64_t>>>> shapes,
             std::shared_ptr<compression::PowerSGD> state, std::optional<std::vector<std::string>> keys) {
            std::vector<std::vector<int64_t>> resolved = ResolveShapes(tensors, shapes);
            return pg.gossip().powersgd_allreduce(std::move(tensors), std::move(resolved), std::move(state),
                                                  keys ? std::move(*keys) : std::vector<std::string>{});
          },
          py::arg("tensors"), py::arg("shapes"), py::arg("state"), py::arg("keys") = py::none(),
          py::call_guard<py::gil_scoped_release>(),
          "PowerSGD all-reduce (average) in place over `tensors`, each compressed as shapes[i] (None: own "
          "shapes), state in `state` (gossipcc._C.PowerSGD) under keys[i] (None: 'tensor<i>'). Returns a Work.")
      .def("quantized_allreduce", OnGossip(&GossipCollectives::quantized_allreduce), py::arg("tensors"), py::arg("bits") = 8,
           py::arg("average") = true, py::arg("residual") = py::none(), py::arg("owned_residual") = py::none(),
           py::arg("block_size") = 256, py::call_guard<py::gil_scoped_release>(),
           "Lossy all-reduce (average, or sum with average=False) of `tensors` (together one float32 CPU vector) in "
           "place, sent as `bits` (8 or 4) per element plus a float32 scale per block_size elements; the same bits "
           "on every rank (compression/quantized_allreduce.h states the error bound). Error feedback: residual and "
           "owned_residual, float32 CPU tensors of the total element count (zeros at first), updated in place. "
           "Bad arguments or ranks that disagree fail the Work on every rank. Returns a Work.")
      .def("fault_tolerant_push_sum", OnGossip(&GossipCollectives::fault_tolerant_push_sum), py::arg("graph") = "exponential",
           py::call_guard<py::gil_scoped_release>(),
           "Collective: a FaultTolerantPushSum state (push-sum that survives dead peers) over this group's ranks, "
           "with a communicator of its own rendezvoused through the group's store (which must survive).")
      .def("fault_tolerant_push_sum_round", OnGossip(&GossipCollectives::fault_tolerant_push_sum_round), py::arg("tensors"),
           py::arg("state"), py::call_guard<py::gil_scoped_release>(),
           "One fault-tolerant push-sum round of `state` in place on `tensors` (this rank's numerator x; CPU "
           "float32/float64); a peer failure makes it recover instead (state.epoch grows). Returns a Work.");
}

}  // namespace

void RunBlocking(ProcessGroupGossipcc& pg, const std::string& what, const std::function<void()>& fn) {
  py::gil_scoped_release release;
  pg.run_on_lane("gossipcc " + what + " on rank " + std::to_string(pg.getRank()), fn);
}

void RegisterProcessGroup(py::module_& m) {
  PyProcessGroup cls(m, "ProcessGroupGossipcc");
  DefineBasics(cls);
  DefineGossipRounds(cls);
  DefineCompressedAndFaultTolerant(cls);
}

}  // namespace torch_backend
}  // namespace gossipcc
