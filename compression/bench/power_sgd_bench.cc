// PowerSGD vs exact all-reduce on the gradient shapes of ResNet-18 and ResNet-50
// (generate_shapes.py wrote them from torchvision), N local ranks as processes over loopback.
// Prints, per model and method: bytes handed to the comm layer per step and rank, the
// compression ratio, the median time per step, and, for PowerSGD, the approximation error
// after warm-up relative to the best rank-r approximation (singular values by Eigen's BDCSVD).
//
//   bazel run //compression/bench:power_sgd_bench -- [--ranks=4] [--steps=5] [--warmup=5]
//       [--models=resnet18_cifar,resnet18,resnet50] [--ranks_r=1,2,4]
//
// Gradients are synthetic: per matrix a fixed rank-8 "signal" with singular values 1, 1/2,
// 1/4, ... shared by all ranks, plus independent per-rank noise (std 0.3/sqrt(m)) each step.
#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/bench/local_ranks.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/core/store.h"
#include "compression/power_sgd.h"

namespace gossipcc {
namespace compression {
namespace {

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 1;
};

std::vector<Param> ReadShapes(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<Param> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    Param p;
    ss >> p.name;
    int64_t d;
    while (ss >> d) {
      p.shape.push_back(d);
      // Checked: a wrapped product could look like a small tensor (3 * 6148914691236517206 = 2 mod 2^64).
      if (d < 0 || __builtin_mul_overflow(p.numel, d, &p.numel)) {
        throw std::runtime_error(path + ": \"" + line + "\": " + p.name +
                                 (d < 0 ? " has a negative dimension" : "'s element count overflows int64"));
      }
    }
    out.push_back(p);
  }
  return out;
}

struct Args {
  int ranks = 4, steps = 5, warmup = 5;
  std::vector<std::string> models = {"resnet18_cifar", "resnet18", "resnet50"};
  std::vector<int> ranks_r = {1, 2, 4};
  std::string shapes_dir = "compression/bench";
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

// Results rank 0 reports back through a pipe.
struct Row {
  char model[32];
  int method;  // 0 exact, else the PowerSGD rank
  double bytes_per_step, ratio, median_ms, rel_error, best_rel_error;
};

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One model's gradients on this rank, handed to PowerSGD through `list`: per matrix a rank-8
// "signal" with a decaying spectrum, the same on every rank, plus each step's noise of this rank.
struct SyntheticGradients {
  SyntheticGradients(const std::vector<Param>& params, int rank);
  // grads = signal + this rank's noise for `step` (seeded by rank, step and tensor).
  void Fill(int step);

  const std::vector<Param>& params;
  const int rank;
  std::vector<std::vector<float>> signal, grads;
  std::vector<GradientTensor> list;  // of grads
};

SyntheticGradients::SyntheticGradients(const std::vector<Param>& params, int rank)
    : params(params), rank(rank), signal(params.size()), grads(params.size()) {
  for (size_t t = 0; t < params.size(); ++t) {
    const Param& p = params[t];
    signal[t].resize(p.numel);
    grads[t].resize(p.numel);
    const int64_t n = p.shape.empty() ? 1 : p.shape[0], m = p.numel / std::max<int64_t>(n, 1);
    // Rank-8 signal with decaying spectrum, the same on every rank (seeded by the index).
    const int k = static_cast<int>(std::min<int64_t>({8, n, m}));
    RowMatrix u(n, k), v(m, k);
    uint64_t s = Mix(t + 1);
    auto unit = [&] { return static_cast<float>(static_cast<double>((s = Mix(s)) >> 11) / 9007199254740992.0 * 2 - 1); };
    for (int64_t i = 0; i < u.size(); ++i) u.data()[i] = unit() / std::sqrt(static_cast<float>(n));
    for (int64_t i = 0; i < v.size(); ++i) v.data()[i] = unit();
    for (int c = 0; c < k; ++c) u.col(c) *= std::ldexp(3.0f, -c);
    Eigen::Map<RowMatrix>(signal[t].data(), n, m) = u * v.transpose();
  }
  for (size_t t = 0; t < params.size(); ++t) {
    list.push_back({params[t].name, CpuBuffer(grads[t].data(), grads[t].size()), params[t].shape});
  }
}

void SyntheticGradients::Fill(int step) {
  for (size_t t = 0; t < params.size(); ++t) {
    const int64_t m = params[t].shape.size() >= 2 ? params[t].numel / params[t].shape[0] : 1;
    const float scale = 0.3f * std::sqrt(3.0f / m);
    uint64_t s = Mix((static_cast<uint64_t>(rank) << 40) ^ (static_cast<uint64_t>(step) << 20) ^ t);
    float* g = grads[t].data();
    const float* sig = signal[t].data();
    for (int64_t i = 0; i < params[t].numel; ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      g[i] = sig[i] + scale * (static_cast<float>(s >> 40) / 8388608.0f - 1.0f);
    }
  }
}

// Method 0 is the exact all-reduce (PowerSGD that never compresses), else PowerSGD of that rank.
PowerSGDOptions OptionsFor(int method) {
  PowerSGDOptions o;
  o.matrix_approximation_rank = std::max(method, 1);
  o.start_powerSGD_iter = method == 0 ? (int64_t{1} << 40) : 0;  // exact: never compress
  return o;
}

// Runs args.warmup untimed steps, then args.steps timed ones: the time (ms) of each timed step.
std::vector<double> TimeSteps(Communicator& comm, PowerSGD& psgd, SyntheticGradients& grads, const Args& args) {
  std::vector<double> times;
  for (int step = 0; step < args.warmup + args.steps; ++step) {
    grads.Fill(step);
    comm.barrier()->wait();
    const auto t0 = std::chrono::steady_clock::now();
    psgd.AllReduce(comm, grads.list);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step >= args.warmup) times.push_back(ms);
  }
  return times;
}

// The row without its errors: the last step's bytes and ratio, the median step time.
Row Summary(const std::string& model, int method, const PowerSGDStats& last, std::vector<double> times) {
  Row row{};
  std::snprintf(row.model, sizeof(row.model), "%s", model.c_str());
  row.method = method;
  row.bytes_per_step = static_cast<double>(last.bytes_after);
  row.ratio = static_cast<double>(last.bytes_before) / last.bytes_after;
  std::sort(times.begin(), times.end());
  row.median_ms = times[times.size() / 2];
  return row;
}

// M_j = grad_j + error_j (PowerSGD's error feedback), averaged exactly across ranks.
std::vector<std::vector<float>> ExactAverages(Communicator& comm, PowerSGD& psgd, const SyntheticGradients& grads) {
  std::vector<std::vector<float>> avg(grads.params.size());
  for (size_t t = 0; t < grads.params.size(); ++t) {
    avg[t] = grads.grads[t];
    PowerSGDTensorState st;
    if (psgd.GetTensorState(grads.params[t].name, &st) && !st.error.empty()) {
      for (size_t i = 0; i < st.error.size(); ++i) avg[t][i] += st.error[i];
    }
    comm.allreduce(CpuBuffer(avg[t].data(), avg[t].size()), ReduceOp::kAvg)->wait();
  }
  return avg;
}

// Over the matrices PowerSGD compresses: row.rel_error, PowerSGD's output (in grads) against
// `avg`, and row.best_rel_error, the truncated SVD of `avg` against it.
void SetErrors(const PowerSGDOptions& o, const SyntheticGradients& grads, const std::vector<std::vector<float>>& avg,
               Row& row) {
  double err2 = 0, best2 = 0, norm2 = 0;
  for (size_t t = 0; t < grads.params.size(); ++t) {
    const Param& p = grads.params[t];
    int r = 0;
    if (!PowerSGD::ShouldCompress(p.shape, o, &r)) continue;
    const int64_t n = p.shape[0], m = p.numel / n;
    Eigen::Map<const RowMatrix> a(avg[t].data(), n, m), out(grads.grads[t].data(), n, m);
    err2 += (a - out).squaredNorm();
    norm2 += a.squaredNorm();
    Eigen::BDCSVD<Eigen::MatrixXf> svd(a);  // singular values only
    const auto& sv = svd.singularValues();
    for (int64_t k = r; k < sv.size(); ++k) best2 += static_cast<double>(sv[k]) * sv[k];
  }
  row.rel_error = std::sqrt(err2 / norm2);
  row.best_rel_error = std::sqrt(best2 / norm2);
}

// One model, one method, on this rank. Returns the row (meaningful on rank 0).
Row RunOne(Communicator& comm, const std::string& model, const std::vector<Param>& params, int method, const Args& args) {
  const PowerSGDOptions o = OptionsFor(method);
  PowerSGD psgd(o);
  SyntheticGradients grads(params, comm.rank());
  std::vector<double> times = TimeSteps(comm, psgd, grads, args);
  Row row = Summary(model, method, psgd.last_stats(), std::move(times));
  if (method > 0) {
    // One more step, measured: M_j = grad_j + error_j, its exact average against PowerSGD's output.
    grads.Fill(args.warmup + args.steps);
    const std::vector<std::vector<float>> avg = ExactAverages(comm, psgd, grads);
    psgd.AllReduce(comm, grads.list);
    if (comm.rank() == 0) SetErrors(o, grads, avg, row);
    comm.barrier()->wait();
  }
  return row;
}

int Main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      const size_t len = std::strlen(key);
      return a.compare(0, len, key) == 0 ? a.c_str() + len : nullptr;
    };
    if (const char* v = value("--ranks=")) args.ranks = std::atoi(v);
    else if (const char* v = value("--steps=")) args.steps = std::atoi(v);
    else if (const char* v = value("--warmup=")) args.warmup = std::atoi(v);
    else if (const char* v = value("--models=")) args.models = Split(v);
    else if (const char* v = value("--shapes_dir=")) args.shapes_dir = v;
    else if (const char* v = value("--ranks_r=")) {
      args.ranks_r.clear();
      for (const std::string& s : Split(v)) args.ranks_r.push_back(std::atoi(s.c_str()));
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (args.ranks < 1 || args.steps < 1 || args.warmup < 0) {
    std::fprintf(stderr, "need --ranks >= 1, --steps >= 1, --warmup >= 0\n");
    return 2;
  }
  std::vector<std::vector<Param>> models;
  for (const std::string& m : args.models) models.push_back(ReadShapes(args.shapes_dir + "/" + m + "_shapes.txt"));

  std::printf("PowerSGD vs exact all-reduce: %d ranks (processes, loopback), %d warm-up + %d timed steps\n", args.ranks,
              args.warmup, args.steps);
  std::printf("%-15s %-12s %14s %10s %12s %9s %11s %13s\n", "model", "method", "bytes/step", "ratio", "ms/step", "speedup",
              "rel. error", "best rank-r");
  double exact_ms = 0;
  const int failed = bench::RunLocalRanksWithRows<Row>(
      args.ranks,
      [&](int r, std::shared_ptr<Store> store, const bench::RowWriter<Row>& out) {
        CommunicatorOptions co;
        co.timeout = std::chrono::minutes(10);
        auto comm = Communicator::Create(std::move(store), r, args.ranks, co);
        for (size_t mi = 0; mi < models.size(); ++mi) {
          std::vector<int> methods = {0};
          for (int rr : args.ranks_r) methods.push_back(rr);
          for (int method : methods) {
            const Row row = RunOne(*comm, args.models[mi], models[mi], method, args);
            if (r == 0 && !out.Write(row)) return 1;
          }
        }
        return 0;
      },
      [&](const Row& row) {
        if (row.method == 0) exact_ms = row.median_ms;
        char method[16];
        std::snprintf(method, sizeof(method), row.method == 0 ? "exact" : "powersgd r=%d", row.method);
        std::printf("%-15s %-12s %14.0f %9.1fx %12.2f %8.2fx", row.model, method, row.bytes_per_step, row.ratio,
                    row.median_ms, exact_ms / row.median_ms);
        if (row.method > 0) {
          std::printf(" %11.4f %13.4f  (x%.2f)\n", row.rel_error, row.best_rel_error,
                      row.best_rel_error > 0 ? row.rel_error / row.best_rel_error : 0.0);
        } else {
          std::printf(" %11s %13s\n", "0", "-");
        }
        std::fflush(stdout);
      });
  std::printf("rel. error: ||avg(M) - out||_F / ||avg(M)||_F over the compressed matrices after warm-up (M = grad + error);\n"
              "best rank-r: the same for the truncated SVD of avg(M); (xN) = PowerSGD error / best error.\n");
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace compression
}  // namespace gossipcc

int main(int argc, char** argv) { return gossipcc::compression::Main(argc, argv); }
