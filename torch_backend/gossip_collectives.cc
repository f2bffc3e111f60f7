#include "torch_backend/gossip_collectives.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "algorithms/async_bilateral_exchange.h"
#include "algorithms/bilateral_exchange.h"
#include "algorithms/fault_tolerant_push_sum.h"
#include "algorithms/hierarchical_bilateral_exchange.h"
#include "algorithms/hierarchical_push_sum.h"
#include "algorithms/hierarchical_symmetric_gossip.h"
#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "algorithms/symmetric_gossip.h"
#include "comm/core/errors.h"
#include "comm/host_groups.h"
#include "compression/hierarchical_power_sgd.h"
#include "compression/power_sgd.h"
#include "torch_backend/gossipcc_work.h"
#include "torch_backend/tensor_buffer.h"

namespace gossipcc {
namespace torch_backend {
namespace {

using ::c10d::OpType;

std::string Where(const char* op, int rank, int size) {
  return std::string("gossipcc ") + op + " on rank " + std::to_string(rank) + " of " + std::to_string(size);
}

void CheckStep(int64_t step, const char* op) {
  if (step < 0) throw InvalidArgumentError(std::string("gossipcc ") + op + ": step must be >= 0, got " + std::to_string(step));
}

std::string DoubleKey(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

}  // namespace

GossipCollectives::GossipCollectives(Communicator& comm, std::shared_ptr<Store> store, OpLane& lane,
                                     OpLane& async_lane, std::shared_ptr<CallbackExecutor> executor)
    : comm_(comm),
      rank_(comm.rank()),
      size_(comm.size()),
      store_(std::move(store)),
      lane_(lane),
      async_lane_(async_lane),
      executor_(std::move(executor)) {}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::Submit(Lane lane, const char* title, const std::string& details,
                                                           std::function<void()> task, std::vector<at::Tensor> outputs,
                                                           bool uses_collectives, std::shared_ptr<int> source) {
  const char* op = title + std::strlen("gossipcc:");
  const bool ordered = lane == Lane::kAlgorithms;
  OpLane& runner = ordered ? lane_ : async_lane_;
  std::shared_ptr<Work> inner = runner.Submit(Where(op, rank_, size_) + details, std::move(task), uses_collectives);
  return Wrap(rank_, Completion{executor_, ordered}, OpType::UNKNOWN, title, std::move(inner), std::move(outputs),
              nullptr, std::move(source));
}

void GossipCollectives::Shutdown() {
  if (std::shared_ptr<HostGroups> groups = algorithms_.Find<HostGroups>("")) {
    groups->host->shutdown();
    groups->across->shutdown();
  }
}

std::shared_ptr<const PeerGraph> GossipCollectives::Graph(const std::string& spec, const char* op, int nodes) {
  if (nodes < 0) nodes = size_;
  const std::string key = nodes == size_ ? spec : spec + "|nodes=" + std::to_string(nodes);
  return algorithms_.Get<const PeerGraph>(key, [&]() -> std::shared_ptr<const PeerGraph> {
    try {
      return MakePeerGraph(spec, nodes);
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(std::string("gossipcc ") + op + ": bad graph spec \"" + spec + "\"" +
                                 (nodes == size_ ? std::string() : " (over " + std::to_string(nodes) + " hosts)") +
                                 ": " + e.what());
    }
  });
}

HostGroups& GossipCollectives::HostGroupsOnLane() {
  if (std::shared_ptr<HostGroups> groups = algorithms_.Find<HostGroups>("")) return *groups;
  // Made outside the cache's lock (a rendezvous); only lane_ makes it, so once.
  auto groups = std::make_shared<HostGroups>(
      HostGroups::Split(comm_, std::make_shared<PrefixStore>("gossipcc_hostgroups", store_), ""));
  return *algorithms_.Get<HostGroups>("", [&] { return groups; });
}

void GossipCollectives::run_on_lane(const std::string& description, std::function<void()> fn,
                                    bool uses_collectives) {
  CallbackExecutor::YieldTurn();  // a completion callback blocking here lets the next one start
  lane_.Run(description, std::move(fn), uses_collectives);
}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::push_sum_round(std::vector<at::Tensor> tensors,
                                                                      at::Tensor weight, int64_t step,
                                                                      const std::string& graph,
                                                                      std::optional<double> keep) {
  const char* op = "push_sum_round";
  std::vector<Buffer> buffers = FloatingBuffers(tensors, op);
  CheckStep(step, op);
  if (!weight.defined() || weight.scalar_type() != at::kDouble || weight.numel() != 1 || !weight.is_cpu() ||
      !weight.is_contiguous()) {
    throw InvalidArgumentError(std::string("gossipcc push_sum_round: weight must be a 1-element float64 CPU tensor, got ") +
                               (weight.defined() ? c10::str(weight.numel(), " x ", weight.scalar_type(), " on ",
                                                            weight.device())
                                                 : std::string("an undefined tensor")));
  }
  if (keep && !(*keep > 0 && *keep <= 1)) {
    throw InvalidArgumentError("gossipcc push_sum_round: keep must be in (0, 1], got " + DoubleKey(*keep));
  }
  const std::string key = graph + (keep ? "|keep=" + DoubleKey(*keep) : std::string("|uniform"));
  SyncCallerStreams(tensors);
  std::vector<at::Tensor> outputs = tensors;
  outputs.push_back(weight);
  if (comm_.hierarchical() && !buffers[0].device.is_cuda()) {
    // Hosts of several ranks (GOSSIPCC_TOPOLOGY): exact means inside each host, push-sum over
    // the hosts on the graph `graph` names for the number of hosts (hierarchical_push_sum.h).
    std::shared_ptr<const PeerGraph> host_graph = Graph(graph, op, comm_.topology().hosts());
    std::shared_ptr<HierarchicalPushSum> push_sum = algorithms_.Get<HierarchicalPushSum>(key, [&] {
      return std::make_shared<HierarchicalPushSum>(host_graph, keep ? KeepShareMixing(*keep) : MixingFn());
    });
    return Submit(
        Lane::kAlgorithms, "gossipcc:push_sum_round",
        " (over hosts, graph " + host_graph->name() + ", step " + std::to_string(step) + ")",
        [this, push_sum, buffers, weight, step]() {
          HostGroups& groups = HostGroupsOnLane();
          double* w = weight.data_ptr<double>();
          push_sum->Restore(step, *w);  // validates w: finite and > 0
          push_sum->Step(groups, buffers);
          *w = push_sum->weight();
        },
        std::move(outputs), /*uses_collectives=*/false);
  }
  std::shared_ptr<const PeerGraph> peer_graph = Graph(graph, op);
  std::shared_ptr<PushSum> push_sum = algorithms_.Get<PushSum>(
      key, [&] { return std::make_shared<PushSum>(peer_graph, keep ? KeepShareMixing(*keep) : MixingFn()); });
  Communicator* comm = &comm_;
  return Submit(
      Lane::kAlgorithms, "gossipcc:push_sum_round", " (graph " + peer_graph->name() + ", step " + std::to_string(step) + ")",
      [comm, push_sum, buffers, weight, step]() {
        double* w = weight.data_ptr<double>();
        push_sum->Restore(step, *w);  // validates w: finite and > 0
        push_sum->Step(*comm, buffers);
        *w = push_sum->weight();
      },
      std::move(outputs), /*uses_collectives=*/false);
}

std::shared_ptr<FaultTolerantPushSum> GossipCollectives::fault_tolerant_push_sum(const std::string& graph) {
  FaultTolerantPushSumOptions o;
  o.graph = graph;
  o.comm = comm_.options();  // this group's timeout and transport settings
  o.comm.rendezvous_timeout = o.comm.timeout;
  // Training resumes from x / w right after a recovery: settle the weights first (exponential
  // graphs halve the deviation per round or better; a deviation of 1e6 takes about 25 rounds).
  o.settle_rounds = 64;
  const int n = algorithms_.Next("fault_tolerant_push_sum");
  try {
    return std::make_shared<FaultTolerantPushSum>(
        std::make_shared<PrefixStore>("gossipcc_ftps/" + std::to_string(n), store_), rank_, size_, o);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(std::string("gossipcc fault_tolerant_push_sum: bad graph spec \"") + graph + "\": " +
                               e.what());
  }
}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::fault_tolerant_push_sum_round(
    std::vector<at::Tensor> tensors, std::shared_ptr<FaultTolerantPushSum> state) {
  const char* op = "fault_tolerant_push_sum_round";
  if (!state) {
    throw InvalidArgumentError("gossipcc fault_tolerant_push_sum_round: state is None (make one with "
                               "fault_tolerant_push_sum(graph))");
  }
  std::vector<Buffer> buffers = FloatingBuffers(tensors, op, /*cpu_only=*/true);
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].dtype != DType::kFloat32 && buffers[i].dtype != DType::kFloat64) {
      throw InvalidArgumentError(std::string("gossipcc fault_tolerant_push_sum_round: tensor ") + std::to_string(i) +
                                 " is " + DTypeName(buffers[i].dtype) + "; float32 or float64 only");
    }
  }
  return Submit(
      Lane::kAlgorithms, "gossipcc:fault_tolerant_push_sum_round",
      " (step " + std::to_string(state->step()) + ", epoch " + std::to_string(state->epoch()) + ")",
      [state, buffers]() { state->Step(buffers); }, tensors, /*uses_collectives=*/false);
}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::symmetric_gossip_round(std::vector<at::Tensor> tensors,
                                                                              int64_t step,
                                                                              const std::string& graph) {
  const char* op = "symmetric_gossip_round";
  std::vector<Buffer> buffers = FloatingBuffers(tensors, op);
  CheckStep(step, op);
  // Hosts of several ranks (GOSSIPCC_TOPOLOGY): exact means inside each host, D-PSGD over the
  // hosts on the graph `graph` names for the number of hosts (hierarchical_symmetric_gossip.h).
  const bool over_hosts = comm_.hierarchical() && !buffers[0].device.is_cuda();
  const int nodes = over_hosts ? comm_.topology().hosts() : size_;
  std::shared_ptr<const PeerGraph> peer_graph = over_hosts ? Graph(graph, op, nodes) : Graph(graph, op);
  // Checked here too (the algorithm would fail the Work) to raise at the call; remembered per
  // step of the graph's period, so that steady-state calls cost no O(world size) check.
  const int64_t phase = step % peer_graph->period();
  const bool symmetric = *algorithms_.Get<const bool>(
      graph + (over_hosts ? "|hosts" : "") + "|phase=" + std::to_string(phase),
      [&] { return std::make_shared<const bool>(peer_graph->IsSymmetricAt(step)); });
  if (!symmetric) {
    throw InvalidArgumentError("gossipcc symmetric_gossip_round: graph " + peer_graph->name() +
                               " is not symmetric (undirected) at step " + std::to_string(step) +
                               "; D-PSGD needs an undirected graph such as \"ring\", \"complete\" or \"hypercube\"");
  }
  SyncCallerStreams(tensors);
  if (over_hosts) {
    std::shared_ptr<HierarchicalSymmetricGossip> gossip = algorithms_.Get<HierarchicalSymmetricGossip>(
        graph, [&] { return std::make_shared<HierarchicalSymmetricGossip>(peer_graph); });
    return Submit(
        Lane::kAlgorithms, "gossipcc:symmetric_gossip_round",
        " (over hosts, graph " + peer_graph->name() + ", step " + std::to_string(step) + ")",
        [this, gossip, buffers, step]() {
          HostGroups& groups = HostGroupsOnLane();
          gossip->Restore(step);
          gossip->Step(groups, buffers);
        },
        tensors, /*uses_collectives=*/false);
  }
  std::shared_ptr<SymmetricGossip> gossip =
      algorithms_.Get<SymmetricGossip>(graph, [&] { return std::make_shared<SymmetricGossip>(peer_graph); });
  Communicator* comm = &comm_;
  return Submit(
      Lane::kAlgorithms, "gossipcc:symmetric_gossip_round",
      " (graph " + peer_graph->name() + ", step " + std::to_string(step) + ")",
      [comm, gossip, buffers, step]() {
        gossip->Restore(step);
        gossip->Step(*comm, buffers);
      },
      tensors, /*uses_collectives=*/false);
}

GossipCollectives::MatchingSpec GossipCollectives::Matching(const std::string& matching, const char* op, int nodes) {
  const std::string over = nodes == size_ ? std::string() : " over " + std::to_string(nodes) + " hosts";
  if (matching == "round_robin") return {BilateralExchange::Matching::kRoundRobin, nullptr};
  if (matching == "bipartite") {
    if (nodes % 2 != 0 && nodes != 1) {
      const char* what = over.empty() ? "ranks" : "hosts";
      throw InvalidArgumentError(std::string("gossipcc bilateral_exchange: the \"bipartite\" matching pairs active (odd) "
                                             "with passive (even) ") + what + " and needs an even number of " + what +
                                 ", got " + std::to_string(nodes));
    }
    return {BilateralExchange::Matching::kBipartiteExponential, nullptr};
  }
  std::shared_ptr<const PeerGraph> graph;
  try {
    graph = Graph(matching, op, nodes);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(std::string("gossipcc bilateral_exchange: matching must be \"round_robin\", "
                                           "\"bipartite\" or a peer graph spec whose steps are matchings; ") +
                               e.what());
  }
  // A matching at every step of its period (checked once per spec).
  for (int64_t k = 0; k < std::min<int64_t>(graph->period(), 4096); ++k) {
    bool ok = graph->IsSymmetricAt(k);
    for (int r = 0; ok && r < nodes; ++r) ok = graph->OutPeers(r, k).size() <= 1;
    if (!ok) {
      throw InvalidArgumentError("gossipcc bilateral_exchange: graph " + graph->name() + over +
                                 " is not a matching at step " + std::to_string(k) +
                                 " (every node needs at most one peer, in both directions); "
                                 "use \"round_robin\", \"bipartite\" or e.g. \"hypercube\"");
    }
  }
  return {BilateralExchange::Matching::kRoundRobin, graph};
}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::bilateral_exchange(std::vector<at::Tensor> tensors,
                                                                       int64_t step,
                                                                       const std::string& matching) {
  const char* op = "bilateral_exchange";
  std::vector<Buffer> buffers = FloatingBuffers(tensors, op);
  CheckStep(step, op);
  SyncCallerStreams(tensors);
  // Hosts of several ranks (GOSSIPCC_TOPOLOGY): exact means inside each host, the exchange over
  // the hosts on the matching `matching` names for the number of hosts
  // (hierarchical_bilateral_exchange.h).
  if (comm_.hierarchical() && !buffers[0].device.is_cuda()) {
    const std::string key = matching + "|hosts";
    // Made outside the cache's lock: a graph's matching comes from the cache too.
    std::shared_ptr<HierarchicalBilateralExchange> exchange = algorithms_.Find<HierarchicalBilateralExchange>(key);
    if (!exchange) {
      const MatchingSpec spec = Matching(matching, op, comm_.topology().hosts());
      exchange = spec.graph ? std::make_shared<HierarchicalBilateralExchange>(spec.graph)
                            : std::make_shared<HierarchicalBilateralExchange>(spec.builtin);
      exchange = algorithms_.Get<HierarchicalBilateralExchange>(key, [&] { return exchange; });
    }
    return Submit(
        Lane::kAlgorithms, "gossipcc:bilateral_exchange",
        " (over hosts, matching " + matching + ", step " + std::to_string(step) + ")",
        [this, exchange, buffers, step]() {
          HostGroups& groups = HostGroupsOnLane();
          exchange->Restore(step);
          exchange->Step(groups, buffers);
        },
        tensors, /*uses_collectives=*/false);
  }
  std::shared_ptr<BilateralExchange> exchange = algorithms_.Find<BilateralExchange>(matching);
  if (!exchange) {
    const MatchingSpec spec = Matching(matching, op, size_);
    exchange = spec.graph ? std::make_shared<BilateralExchange>(spec.graph)
                          : std::make_shared<BilateralExchange>(spec.builtin);
    exchange = algorithms_.Get<BilateralExchange>(matching, [&] { return exchange; });
  }
  Communicator* comm = &comm_;
  return Submit(
      Lane::kAlgorithms, "gossipcc:bilateral_exchange", " (matching " + matching + ", step " + std::to_string(step) + ")",
      [comm, exchange, buffers, step]() {
        exchange->Restore(step);
        exchange->Step(*comm, buffers);
      },
      tensors, /*uses_collectives=*/false);
}

std::shared_ptr<AsyncBilateralExchange> GossipCollectives::AsyncBilateral() {
  return algorithms_.Get<AsyncBilateralExchange>("", [] { return std::make_shared<AsyncBilateralExchange>(); });
}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::async_bilateral_exchange(std::vector<at::Tensor> tensors) {
  const char* op = "async_bilateral_exchange";
  std::vector<Buffer> buffers = FloatingBuffers(tensors, op, /*cpu_only=*/true);
  if (!AsyncBilateralExchange::IsActive(rank_)) {
    throw InvalidArgumentError("gossipcc async_bilateral_exchange: rank " + std::to_string(rank_) +
                               " is passive (even); passive ranks call async_bilateral_serve");
  }
  auto exchange = AsyncBilateral();
  Communicator* comm = &comm_;
  auto peer = std::make_shared<int>(-1);
  return Submit(
      Lane::kAsync, "gossipcc:async_bilateral_exchange", "",
      [this, comm, exchange, buffers, peer]() {
        *peer = exchange->Exchange(*comm, buffers);
        std::lock_guard<std::mutex> lock(async_stats_mu_);
        async_stats_.exchanges = exchange->exchanges();
        async_stats_.last_peer = *peer;
      },
      tensors, /*uses_collectives=*/false, peer);
}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::async_bilateral_serve(std::vector<at::Tensor> tensors,
                                                                             int max_requests) {
  const char* op = "async_bilateral_serve";
  std::vector<Buffer> buffers = FloatingBuffers(tensors, op, /*cpu_only=*/true);
  if (AsyncBilateralExchange::IsActive(rank_)) {
    throw InvalidArgumentError("gossipcc async_bilateral_serve: rank " + std::to_string(rank_) +
                               " is active (odd); active ranks call async_bilateral_exchange");
  }
  if (max_requests < -1) {
    throw InvalidArgumentError("gossipcc async_bilateral_serve: max_requests must be >= 0 or -1 (no limit), got " +
                               std::to_string(max_requests));
  }
  auto exchange = AsyncBilateral();
  Communicator* comm = &comm_;
  return Submit(
      Lane::kAsync, "gossipcc:async_bilateral_serve", " (max_requests " + std::to_string(max_requests) + ")",
      [this, comm, exchange, buffers, max_requests]() {
        // Stats are updated even if serving fails part-way (what was answered stays answered).
        struct Publish {
          GossipCollectives* pg;
          AsyncBilateralExchange* ex;
          Communicator* comm;
          ~Publish() {
            std::lock_guard<std::mutex> lock(pg->async_stats_mu_);
            pg->async_stats_.exchanges = ex->exchanges();
            pg->async_stats_.all_active_finished = ex->all_active_finished(*comm);
          }
        } publish{this, exchange.get(), comm};
        exchange->Serve(*comm, buffers, max_requests);
      },
      tensors, /*uses_collectives=*/false);
}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::async_bilateral_finish(std::vector<at::Tensor> tensors) {
  const char* op = "async_bilateral_finish";
  std::vector<Buffer> buffers = FloatingBuffers(tensors, op, /*cpu_only=*/true);
  if (!AsyncBilateralExchange::IsActive(rank_)) {
    throw InvalidArgumentError("gossipcc async_bilateral_finish: rank " + std::to_string(rank_) +
                               " is passive (even); only active ranks finish");
  }
  auto exchange = AsyncBilateral();
  Communicator* comm = &comm_;
  return Submit(
      Lane::kAsync, "gossipcc:async_bilateral_finish", "",
      [comm, exchange, buffers]() { exchange->Finish(*comm, buffers); }, tensors, /*uses_collectives=*/false);
}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::async_bilateral_restore(int64_t exchanges) {
  if (exchanges < 0) {
    throw InvalidArgumentError("gossipcc async_bilateral_restore: exchanges must be >= 0, got " +
                               std::to_string(exchanges));
  }
  auto exchange = AsyncBilateral();
  return Submit(
      Lane::kAsync, "gossipcc:async_bilateral_restore", " (exchanges " + std::to_string(exchanges) + ")",
      [this, exchange, exchanges]() {
        exchange->Restore(exchanges);
        std::lock_guard<std::mutex> lock(async_stats_mu_);
        async_stats_.exchanges = exchanges;
      },
      {}, /*uses_collectives=*/false);
}

GossipCollectives::AsyncBilateralStats GossipCollectives::async_bilateral_stats() const {
  std::lock_guard<std::mutex> lock(async_stats_mu_);
  return async_stats_;
}

c10::intrusive_ptr<::c10d::Work> GossipCollectives::powersgd_allreduce(
    std::vector<at::Tensor> tensors, std::vector<std::vector<int64_t>> shapes,
    std::shared_ptr<compression::PowerSGD> state, std::vector<std::string> keys) {
  const char* op = "powersgd_allreduce";
  if (!state) throw InvalidArgumentError("gossipcc powersgd_allreduce: state is None (pass a gossipcc._C.PowerSGD)");
  std::vector<Buffer> buffers = FloatingBuffers(tensors, op);
  if (!shapes.empty() && shapes.size() != tensors.size()) {
    throw InvalidArgumentError("gossipcc powersgd_allreduce: " + std::to_string(tensors.size()) + " tensors but " +
                               std::to_string(shapes.size()) + " shapes");
  }
  if (!keys.empty() && keys.size() != tensors.size()) {
    throw InvalidArgumentError("gossipcc powersgd_allreduce: " + std::to_string(tensors.size()) + " tensors but " +
                               std::to_string(keys.size()) + " keys (one stable key per tensor)");
  }
  std::vector<compression::GradientTensor> grads;
  grads.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    std::vector<int64_t> shape = shapes.empty() ? std::vector<int64_t>(t.sizes().begin(), t.sizes().end()) : shapes[i];
    int64_t product = 1;
    for (int64_t d : shape) {
      if (d < 0) throw InvalidArgumentError("gossipcc powersgd_allreduce: shapes[" + std::to_string(i) + "] has a negative dimension");
      if (__builtin_mul_overflow(product, d, &product)) {
        throw InvalidArgumentError("gossipcc powersgd_allreduce: shapes[" + std::to_string(i) + "] = " +
                                   c10::str(c10::IntArrayRef(shape)) + ": its element count overflows 64 bits");
      }
    }
    if (shape.empty()) shape = {1};  // a scalar: one element, averaged exactly
    if (product != t.numel()) {
      throw InvalidArgumentError("gossipcc powersgd_allreduce: shapes[" + std::to_string(i) + "] = " +
                                 c10::str(c10::IntArrayRef(shape)) + " has " + std::to_string(product) +
                                 " elements but tensor[" + std::to_string(i) + "] has " + std::to_string(t.numel()));
    }
    grads.push_back({keys.empty() ? "tensor" + std::to_string(i) : keys[i], buffers[i], std::move(shape)});
  }
  SyncCallerStreams(tensors);
  Communicator* comm = &comm_;
  // Hosts of several ranks (GOSSIPCC_TOPOLOGY): exact means inside each host, PowerSGD across
  // hosts once per host (compression/hierarchical_power_sgd.h). The same choice on every rank.
  const bool over_hosts = comm->hierarchical() && !buffers.empty() && !buffers[0].device.is_cuda();
  return Submit(
      Lane::kAlgorithms, "gossipcc:powersgd_allreduce",
      " (" + std::to_string(tensors.size()) + " tensors" + (over_hosts ? ", over hosts" : "") + ")",
      [this, comm, over_hosts, state, grads = std::move(grads)]() {
        if (over_hosts) {
          compression::HierarchicalPowerSGDAllReduce(*state, HostGroupsOnLane(), grads);
        } else {
          state->AllReduce(*comm, grads);
        }
      },
      tensors, /*uses_collectives=*/true);
}

}  // namespace torch_backend
}  // namespace gossipcc
