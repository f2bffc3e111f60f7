#include "tests/reliability/soak.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "comm/communicator.h"
#include "compression/power_sgd.h"

namespace gossipcc {
namespace soak {
namespace {

using Clock = std::chrono::steady_clock;

// Runs body(comm) on `n` threads, each with its own Communicator on one in-process store.
template <typename Body>
void OnRanks(int n, Body body) {
  auto store = MakeHashStore();
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr error;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        CommunicatorOptions o;
        o.timeout = std::chrono::seconds(120);
        auto comm = Communicator::Create(store, r, n, o);
        body(*comm);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

}  // namespace

double RssMb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

void Run(PushSumSoak& s) {
  const auto start = Clock::now();
  const int n = s.ranks;
  const size_t m = s.elements;
  std::shared_ptr<const PeerGraph> graph = MakePeerGraph(s.graph, n);
  std::vector<double> initial_sum(m, 0.0);
  for (int r = 0; r < n; ++r) {
    for (size_t e = 0; e < m; ++e) initial_sum[e] += std::sin(0.37 * (r + 1) * (e + 1)) * (r + 1) + 2.0;
  }
  std::mutex mu;
  OnRanks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    PushSum ps(graph);
    std::vector<double> x(m);
    for (size_t e = 0; e < m; ++e) x[e] = std::sin(0.37 * (r + 1) * (e + 1)) * (r + 1) + 2.0;
    for (int64_t k = 0; k < s.rounds; ++k) {
      if (k == 100) {
        comm.barrier()->wait();
        if (r == 0) s.rss_start_mb = RssMb();
      }
      ps.Step(comm, {CpuBuffer(x.data(), m)});
    }
    std::vector<double> sums(x);
    sums.push_back(ps.weight());
    comm.allreduce(CpuBuffer(sums.data(), sums.size()))->wait();
    double consensus = 0, drift = 0;
    for (size_t e = 0; e < m; ++e) {
      drift = std::max(drift, std::abs(sums[e] - initial_sum[e]) / std::abs(initial_sum[e]));
      const double avg = initial_sum[e] / n;
      consensus = std::max(consensus, std::abs(x[e] / ps.weight() - avg) / std::abs(avg));
    }
    comm.barrier()->wait();
    std::lock_guard<std::mutex> lock(mu);
    s.consensus = std::max(s.consensus, consensus);
    if (r == 0) {
      s.x_drift = drift;
      s.w_drift = std::abs(sums[m] - n) / n;
      s.rss_end_mb = RssMb();
    }
  });
  s.seconds = Seconds(start);
}

void Run(PowerSGDSoak& s) {
  const auto start = Clock::now();
  const int n = s.ranks;
  const size_t count = static_cast<size_t>(s.rows) * s.cols;
  std::mutex mu;
  OnRanks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    compression::PowerSGDOptions o;
    o.matrix_approximation_rank = s.rank;
    o.start_powerSGD_iter = 2;
    compression::PowerSGD psgd(o);
    std::mt19937_64 gen(1234 + r);
    std::normal_distribution<float> noise(0.0f, 1.0f);
    std::vector<float> g(count);
    // lhs: sum of outputs; rhs (this rank's part): sum of own gradients; both in float64.
    std::vector<double> out_sum(count, 0.0), grad_sum(count, 0.0);
    for (int64_t t = 0; t < s.steps; ++t) {
      if (t == 50) {
        comm.barrier()->wait();
        if (r == 0) s.rss_start_mb = RssMb();
      }
      for (size_t i = 0; i < count; ++i) {
        g[i] = 0.1f * static_cast<float>((i % s.cols) + 1) / s.cols + noise(gen);  // a signal plus noise
        grad_sum[i] += g[i];
      }
      compression::GradientTensor tensor{"w", CpuBuffer(g.data(), count), {s.rows, s.cols}};
      psgd.AllReduce(comm, absl::MakeConstSpan(&tensor, 1));
      for (size_t i = 0; i < count; ++i) out_sum[i] += g[i];
    }
    compression::PowerSGDTensorState state;
    psgd.GetTensorState("w", &state);
    // rhs = mean_i sum_t g_i(t); lhs = sum_t out(t) + mean_i e_i(T).
    std::vector<double> both(2 * count, 0.0);
    for (size_t i = 0; i < count; ++i) {
      both[i] = grad_sum[i] / n;
      both[count + i] = state.error.empty() ? 0.0 : static_cast<double>(state.error[i]) / n;
    }
    comm.allreduce(CpuBuffer(both.data(), both.size()))->wait();
    double worst = 0, scale = 0;
    for (size_t i = 0; i < count; ++i) {
      const double lhs = out_sum[i] + both[count + i];
      worst = std::max(worst, std::abs(lhs - both[i]));
      scale = std::max(scale, std::abs(both[i]));
    }
    comm.barrier()->wait();
    std::lock_guard<std::mutex> lock(mu);
    s.identity_error = std::max(s.identity_error, worst / scale);
    if (r == 0) s.rss_end_mb = RssMb();
  });
  s.seconds = Seconds(start);
}

}  // namespace soak
}  // namespace gossipcc
