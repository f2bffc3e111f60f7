// Allreduce bus bandwidth of gossipcc's Communicator vs calling gloo::allreduce directly,
// 4 local ranks, 4 KB .. 256 MB of float32 (or float16/bfloat16), measured in the same run on
// the same buffers.
//
//   bazel run //comm/bench:allreduce_vs_gloo -- [--ranks=4] [--max_bytes=268435456] [--dtype=float32]
//
// Three columns: raw Gloo; Communicator with cross-rank signature checks (the default);
// Communicator with verify_collectives=false. Ratio = gossipcc time / raw Gloo time. For
// float16/bfloat16 raw Gloo sums in the dtype itself (rounding at every hop, as Gloo's own
// float16 sum does), while gossipcc accumulates in float32 and rounds once.
#include <gloo/allreduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/bench/local_ranks.h"
#include "comm/communicator.h"
#include "comm/core/reduce.h"

namespace gossipcc {
namespace {

using Clock = std::chrono::steady_clock;

// Raw Gloo's reduction for `dtype`: c = a + b element-wise, in the dtype's own precision.
void RawSum(DType dtype, void* c, const void* a, const void* b, size_t k) {
  if (dtype == DType::kFloat32) {
    auto* o = static_cast<float*>(c);
    auto* x = static_cast<const float*>(a);
    auto* y = static_cast<const float*>(b);
    for (size_t i = 0; i < k; ++i) o[i] = x[i] + y[i];
    return;
  }
  auto* o = static_cast<uint16_t*>(c);
  auto* x = static_cast<const uint16_t*>(a);
  auto* y = static_cast<const uint16_t*>(b);
  if (dtype == DType::kFloat16) {
    for (size_t i = 0; i < k; ++i) o[i] = FloatToHalf(HalfToFloat(x[i]) + HalfToFloat(y[i]));
  } else {
    for (size_t i = 0; i < k; ++i) o[i] = FloatToBFloat16(BFloat16ToFloat(x[i]) + BFloat16ToFloat(y[i]));
  }
}

// A raw Gloo context of its own, connected the way c10d's ProcessGroupGloo does, through
// `store` (keys under "raw/").
std::shared_ptr<gloo::rendezvous::Context> ConnectRawGloo(int rank, int n, std::shared_ptr<Store> store) {
  auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
  auto raw = std::make_shared<gloo::rendezvous::Context>(rank, n);
  struct Bridge : gloo::rendezvous::Store {
    std::shared_ptr<gossipcc::Store> s;
    void set(const std::string& k, const std::vector<char>& v) override { s->set("raw/" + k, v); }
    std::vector<char> get(const std::string& k) override { return s->get("raw/" + k, std::chrono::seconds(60)); }
    void wait(const std::vector<std::string>& keys) override {
      std::vector<std::string> p;
      for (auto& k : keys) p.push_back("raw/" + k);
      s->wait(p, std::chrono::seconds(60));
    }
  } bridge;
  bridge.s = store;
  raw->connectFullMesh(bridge, device);
  return raw;
}

// What is timed: raw Gloo, the Communicator with signature checks (the default), and one
// without (verify_collectives=false).
struct Contenders {
  std::unique_ptr<Communicator> checked, unchecked;
  std::shared_ptr<gloo::rendezvous::Context> raw;
  uint32_t raw_tag = 0;
};

Contenders Connect(int n, int rank, std::shared_ptr<Store> store) {
  Contenders c;
  CommunicatorOptions unchecked;
  unchecked.verify_collectives = false;
  c.checked = Communicator::Create(std::make_shared<PrefixStore>("checked", store), rank, n, CommunicatorOptions());
  c.unchecked = Communicator::Create(std::make_shared<PrefixStore>("unchecked", store), rank, n, unchecked);
  c.raw = ConnectRawGloo(rank, n, store);
  return c;
}

void PrintHeader(DType dtype, int n) {
  printf("allreduce (sum, %s), %d ranks, local processes over loopback; median of k runs\n", DTypeName(dtype), n);
  printf("%10s %4s %12s %12s %12s %12s %9s %9s\n", "bytes", "k", "gloo (us)", "gossipcc(us)", "unchecked",
         "busbw GB/s", "ratio", "ratio-uc");
}

// `bytes` of 1.0 in `dtype` (the sums stay exact: n <= 256).
std::vector<uint8_t> Ones(DType dtype, size_t bytes) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes / ElementSize(dtype); ++i) {
    if (dtype == DType::kFloat32) reinterpret_cast<float*>(data.data())[i] = 1.0f;
    else reinterpret_cast<uint16_t*>(data.data())[i] = dtype == DType::kFloat16 ? 0x3C00 : 0x3F80;
  }
  return data;
}

// Runs each of `runs` once untimed, then `iters` rounds of all of them in turn (interleaved, so
// drift in machine load hits them alike), each run after a barrier on `comm`. Returns each
// one's times in seconds.
std::array<std::vector<double>, 3> TimeInterleaved(Communicator& comm, int iters,
                                                   const std::array<std::function<void()>, 3>& runs) {
  std::array<std::vector<double>, 3> times;
  for (const auto& run : runs) run();
  for (int i = 0; i < iters; ++i) {
    for (int which = 0; which < 3; ++which) {
      comm.barrier()->wait();
      const auto start = Clock::now();
      runs[which]();
      times[which].push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  return times;
}

// The median of this rank's times, then the largest of those across ranks.
double MedianAcrossRanks(Communicator& comm, std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  double m = v[v.size() / 2];
  comm.allreduce(CpuBuffer(&m, 1), ReduceOp::kMax)->wait();
  return m;
}

// One row: `iters` timed all-reduces of `bytes` by each contender; rank 0 prints it.
void RunSize(Contenders& c, DType dtype, size_t bytes, int iters, int n, int rank) {
  const size_t element = ElementSize(dtype);
  const size_t count = bytes / element;
  std::vector<uint8_t> data = Ones(dtype, bytes);
  const Buffer buffer{data.data(), count, dtype, Device::CPU()};
  auto run_raw = [&] {
    gloo::AllreduceOptions opts(c.raw);
    if (element == 4) opts.setOutput(reinterpret_cast<float*>(data.data()), count);
    else opts.setOutput(reinterpret_cast<uint16_t*>(data.data()), count);
    opts.setReduceFunction([dtype](void* out, const void* a, const void* b, size_t k) { RawSum(dtype, out, a, b, k); });
    opts.setTag(c.raw_tag++);
    gloo::allreduce(opts);
  };
  auto run_checked = [&] { c.checked->allreduce(buffer)->wait(); };
  auto run_unchecked = [&] { c.unchecked->allreduce(buffer)->wait(); };
  auto times = TimeInterleaved(*c.checked, iters, {run_raw, run_checked, run_unchecked});
  const double g = MedianAcrossRanks(*c.checked, times[0]);
  const double ch = MedianAcrossRanks(*c.checked, times[1]);
  const double u = MedianAcrossRanks(*c.checked, times[2]);
  if (rank == 0) {
    const double busbw = bytes / ch / 1e9 * 2.0 * (n - 1) / n;
    printf("%10s %4d %12.1f %12.1f %12.1f %12.3f %9.3f %9.3f\n", bench::HumanBytes(bytes).c_str(), iters, g * 1e6,
           ch * 1e6, u * 1e6, busbw, ch / g, u / g);
    fflush(stdout);
  }
}

int RunRank(int n, size_t max_bytes, DType dtype, int rank, std::shared_ptr<Store> store) {
  Contenders contenders = Connect(n, rank, store);
  if (rank == 0) PrintHeader(dtype, n);
  for (size_t bytes = 4 << 10; bytes <= max_bytes; bytes *= 4) {
    const int iters = bytes >= (64u << 20) ? 5 : bytes >= (4u << 20) ? 9 : 41;
    RunSize(contenders, dtype, bytes, iters, n, rank);
  }
  return 0;
}

}  // namespace
}  // namespace gossipcc

int main(int argc, char** argv) {
  int ranks = 4;
  size_t max_bytes = 256u << 20;
  gossipcc::DType dtype = gossipcc::DType::kFloat32;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--ranks=", 0) == 0) {
      ranks = std::atoi(a.c_str() + 8);
    } else if (a.rfind("--max_bytes=", 0) == 0) {
      max_bytes = std::strtoull(a.c_str() + 12, nullptr, 10);
    } else if (a == "--dtype=float32" || a == "--dtype=float16" || a == "--dtype=bfloat16") {
      dtype = a == "--dtype=float32"   ? gossipcc::DType::kFloat32
              : a == "--dtype=float16" ? gossipcc::DType::kFloat16
                                       : gossipcc::DType::kBFloat16;
    } else {
      fprintf(stderr, "unknown flag %s (flags: --ranks=N --max_bytes=B --dtype=float32|float16|bfloat16)\n",
              argv[i]);
      return 2;
    }
  }
  return gossipcc::bench::RunLocalRanks(ranks, [&](int rank, std::shared_ptr<gossipcc::Store> store) {
    return gossipcc::RunRank(ranks, max_bytes, dtype, rank, store);
  });
}
