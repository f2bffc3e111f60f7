// gossipcc._C's algorithms (algorithms/): the fault-tolerant push-sum's state, the peer graphs
// and matchings as the collectives use them, elastic averaging and all-reduce SGD with uneven
// steps. Their collectives block, on the process group's algorithm lane with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/async_bilateral_exchange.h"
#include "algorithms/bilateral_exchange.h"
#include "algorithms/elastic_averaging.h"
#include "algorithms/fault_tolerant_push_sum.h"
#include "algorithms/peer_graph.h"
#include "algorithms/symmetric_gossip.h"
#include "algorithms/uneven_allreduce_sgd.h"
#include "comm/core/errors.h"
#include "torch_backend/process_group_gossipcc.h"
#include "torch_backend/python_bindings.h"
#include "torch_backend/tensor_buffer.h"

namespace py = pybind11;

namespace gossipcc {
namespace torch_backend {
namespace {

// Floating-point buffers over `tensors` (after the caller's streams); returns the tensors, which
// the caller keeps alive while the buffers are in use.
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

py::dict RecoveryDict(const FaultTolerantPushSum& ps) {
  const RecoveryReport& r = ps.last_recovery();
  py::dict d;
  d["epoch"] = r.epoch;
  d["dead"] = r.dead;
  d["departed"] = r.departed;
  d["members"] = r.members;
  d["step"] = r.step;
  d["weight_correction"] = r.weight_correction;
  return d;
}

// The state of a fault-tolerant push-sum (algorithms/fault_tolerant_push_sum.h), made by
// ProcessGroupGossipcc.fault_tolerant_push_sum. Read it only while no round is in flight.
void RegisterFaultTolerantPushSum(py::module_& m) {
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
      .def_property_readonly("last_recovery", &RecoveryDict,
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
}

// Peer graphs and matchings as the collectives use them (for references in tests and tools).
void RegisterPeerGraphQueries(py::module_& m) {
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
}

py::dict ElasticStateDict(const ElasticAveraging& e) {
  py::dict d;
  d["tau"] = e.tau();
  d["alpha"] = e.alpha();
  d["step"] = e.step();
  d["center"] = DoublesToTensor(e.center());
  return d;
}

void LoadElasticState(ElasticAveraging& e, const py::dict& d) {
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
}

// Elastic averaging (algorithms/elastic_averaging.h), blocking, over a process group.
void RegisterElasticAveraging(py::module_& m) {
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
      .def("state_dict", &ElasticStateDict)
      .def("load_state_dict", &LoadElasticState, py::arg("state"));
}

py::dict UnevenStateDict(const UnevenAllReduceSGD& u) {
  py::dict d;
  d["steps_contributed"] = u.steps_contributed();
  d["collectives"] = u.collectives();
  d["steps_since_sync"] = u.steps_since_sync();
  return d;
}

void LoadUnevenState(UnevenAllReduceSGD& u, const py::dict& d) {
  for (const char* k : {"steps_contributed", "collectives"}) {
    if (!d.contains(k)) throw InvalidArgumentError(std::string("UnevenAllReduceSGD.load_state_dict: missing key '") + k + "'");
  }
  const int64_t steps = d["steps_contributed"].cast<int64_t>();
  // States saved before steps_since_sync existed: AllReduceSGD synchronises once, at
  // finish(), so until then every contributed step is one since the last synchronisation.
  const int64_t since = d.contains("steps_since_sync") ? d["steps_since_sync"].cast<int64_t>() : steps;
  u.Restore(steps, d["collectives"].cast<int64_t>(), since);
}

// All-reduce SGD with uneven steps (algorithms/uneven_allreduce_sgd.h), blocking.
void RegisterUnevenAllReduceSGD(py::module_& m) {
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
      .def("state_dict", &UnevenStateDict)
      .def("load_state_dict", &LoadUnevenState, py::arg("state"));
}

}  // namespace

void RegisterAlgorithms(py::module_& m) {
  RegisterFaultTolerantPushSum(m);
  RegisterPeerGraphQueries(m);
  RegisterElasticAveraging(m);
  RegisterUnevenAllReduceSGD(m);
}

}  // namespace torch_backend
}  // namespace gossipcc
