// Every collective of Communicator against a locally computed reference: n = 1..8 ranks,
// as threads and as processes, every dtype, sizes 0, 1, odd and larger; 64 MB separately.
// Under ASan/TSan, the two share the (mode, n) pairs out, each n under one (RankSweep, harness.h).
#include "comm/communicator.h"
#include "comm/core/errors.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"
#include "tests/comm/typed_array.h"

namespace gossipcc {
namespace testing {
namespace {
using ::testing::AllOf;
using ::testing::HasSubstr;

const std::vector<size_t> kSizes = {0, 1, 7, 1001};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                    ReduceOp::kProduct};

// kSizes plus the two counts either side of the eager limit (EagerCollectiveMaxBytes), so
// both the eager path and Gloo's algorithms run; `per_rank` elements make up one rank's payload
// per counted element (reduce-scatter: size()).
std::vector<size_t> Sizes(int n, DType dtype, size_t per_rank = 1) {
  std::vector<size_t> sizes = kSizes;
  if (n == 1) return sizes;
  const size_t at_limit = EagerCollectiveMaxBytes(n) / (ElementSize(dtype) * per_rank);
  sizes.push_back(at_limit);
  sizes.push_back(at_limit + 1);
  return sizes;
}

// Small integers, so every sum is exact in every dtype (|sum| <= 40 fits int8).
double InputValue(int rank, size_t i, DType dtype, ReduceOp op) {
  if (op == ReduceOp::kProduct) {
    if (dtype == DType::kUInt8) return (rank + i) % 5 == 0 ? 2 : 1;
    return (rank + i) % 3 == 0 ? -1 : 1;
  }
  const double v = static_cast<double>((rank * 7 + i * 3) % 11);
  return dtype == DType::kUInt8 ? v : v - 5;
}

double Reference(int n, size_t i, DType dtype, ReduceOp op) {
  double acc = InputValue(0, i, dtype, op);
  for (int r = 1; r < n; ++r) {
    const double v = InputValue(r, i, dtype, op);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  return op == ReduceOp::kAvg ? acc / n : acc;
}

void Fill(TypedArray& a, int rank, ReduceOp op, size_t offset = 0) {
  for (size_t i = 0; i < a.size(); ++i) a.set(i, InputValue(rank, i + offset, a.dtype(), op));
}

// All-reduces Fill()'s values of this rank (`count` elements of `dtype`) with `op` and checks
// every element against Reference.
void AllreduceAndCheckEveryElement(Communicator& comm, DType dtype, ReduceOp op, size_t count) {
  TypedArray a(dtype, count);
  Fill(a, comm.rank(), op);
  comm.allreduce(a.buffer(), op)->wait();
  for (size_t i = 0; i < count; ++i) {
    const double want = Reference(comm.size(), i, dtype, op);
    ASSERT_NEAR(a.get(i), want, Tolerance(dtype, want))
        << DTypeName(dtype) << " " << ReduceOpName(op) << " count " << count << " index " << i;
  }
}

using Param = std::tuple<LaunchMode, int>;

class CollectivesTest : public ::testing::TestWithParam<Param> {
 protected:
  LaunchMode mode() const { return std::get<0>(GetParam()); }
  int n() const { return std::get<1>(GetParam()); }
};

TEST_P(CollectivesTest, AllreduceEveryDtypeOpAndSize) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    const int n = comm.size();
    for (DType dtype : AllDTypes()) {
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) continue;  // rejected: see errors test
        for (size_t count : Sizes(n, dtype)) {
          ASSERT_NO_FATAL_FAILURE(AllreduceAndCheckEveryElement(comm, dtype, op, count));
        }
      }
    }
  });
}

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    for (DType dtype : AllDTypes()) {
      for (int root = 0; root < comm.size(); ++root) {
        for (size_t count : Sizes(comm.size(), dtype)) {
          TypedArray a(dtype, count);
          Fill(a, comm.rank(), ReduceOp::kSum);
          comm.broadcast(a.buffer(), root)->wait();
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(a.get(i), InputValue(root, i, dtype, ReduceOp::kSum)) << DTypeName(dtype) << " root " << root;
          }
        }
      }
    }
  });
}

TEST_P(CollectivesTest, AllgatherAndAllgatherv) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    const int n = comm.size();
    for (DType dtype : AllDTypes()) {
      for (size_t count : Sizes(n, dtype)) {
        TypedArray in(dtype, count), out(dtype, count * n);
        Fill(in, comm.rank(), ReduceOp::kSum);
        comm.allgather(in.buffer(), out.buffer())->wait();
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(out.get(r * count + i), InputValue(r, i, dtype, ReduceOp::kSum)) << DTypeName(dtype);
      }
      // Varying sizes, including a rank that contributes nothing.
      std::vector<size_t> counts(n);
      for (int r = 0; r < n; ++r) counts[r] = (r * 5 + 3) % 7;
      const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
      TypedArray in(dtype, counts[comm.rank()]), out(dtype, total);
      Fill(in, comm.rank(), ReduceOp::kSum);
      comm.allgatherv(in.buffer(), out.buffer(), counts)->wait();
      size_t offset = 0;
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < counts[r]; ++i)
          ASSERT_EQ(out.get(offset + i), InputValue(r, i, dtype, ReduceOp::kSum)) << DTypeName(dtype) << " rank " << r;
        offset += counts[r];
      }
    }
  });
}

TEST_P(CollectivesTest, ReduceScatter) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    const int n = comm.size();
    for (DType dtype : AllDTypes()) {
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) continue;
        for (size_t chunk : Sizes(n, dtype, n)) {
          TypedArray in(dtype, chunk * n), out(dtype, chunk);
          Fill(in, comm.rank(), op);
          comm.reduce_scatter(in.buffer(), out.buffer(), op)->wait();
          for (size_t i = 0; i < chunk; ++i) {
            const double want = Reference(n, comm.rank() * chunk + i, dtype, op);
            ASSERT_NEAR(out.get(i), want, Tolerance(dtype, want))
                << DTypeName(dtype) << " " << ReduceOpName(op) << " chunk " << chunk << " index " << i;
          }
        }
      }
    }
  });
}

// Element i of the chunk rank `from` sends to rank `to`.
double A2AValue(int from, int to, size_t i) { return static_cast<double>((from * 13 + to * 5 + i) % 23); }

TEST_P(CollectivesTest, AlltoallAndAlltoallv) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    const int n = comm.size();
    const int me = comm.rank();
    for (DType dtype : AllDTypes()) {
      for (size_t chunk : kSizes) {
        TypedArray in(dtype, chunk * n), out(dtype, chunk * n);
        for (int to = 0; to < n; ++to)
          for (size_t i = 0; i < chunk; ++i) in.set(to * chunk + i, A2AValue(me, to, i));
        comm.alltoall(in.buffer(), out.buffer())->wait();
        for (int from = 0; from < n; ++from)
          for (size_t i = 0; i < chunk; ++i) ASSERT_EQ(out.get(from * chunk + i), A2AValue(from, me, i));
      }
      // Rank f sends (f + t) % 4 elements to rank t.
      std::vector<size_t> send(n), recv(n);
      for (int t = 0; t < n; ++t) send[t] = (me + t) % 4;
      for (int f = 0; f < n; ++f) recv[f] = (f + me) % 4;
      TypedArray in(dtype, std::accumulate(send.begin(), send.end(), size_t{0}));
      TypedArray out(dtype, std::accumulate(recv.begin(), recv.end(), size_t{0}));
      size_t off = 0;
      for (int t = 0; t < n; ++t)
        for (size_t i = 0; i < send[t]; ++i) in.set(off++, A2AValue(me, t, i));
      comm.alltoallv(in.buffer(), send, out.buffer(), recv)->wait();
      off = 0;
      for (int f = 0; f < n; ++f)
        for (size_t i = 0; i < recv[f]; ++i) ASSERT_EQ(out.get(off++), A2AValue(f, me, i)) << DTypeName(dtype);
    }
  });
}

TEST_P(CollectivesTest, BarrierAndPointToPoint) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    const int n = comm.size();
    const int me = comm.rank();
    comm.barrier()->wait();
    if (n == 1) return;
    for (DType dtype : AllDTypes()) {
      for (size_t count : kSizes) {
        // A gossip-style round: send to both ring neighbours and receive from both, fused.
        const int right = (me + 1) % n, left = (me - 1 + n) % n;
        TypedArray to_right(dtype, count), to_left(dtype, count), from_left(dtype, count), from_right(dtype, count);
        for (size_t i = 0; i < count; ++i) {
          to_right.set(i, A2AValue(me, right, i));
          to_left.set(i, A2AValue(me, left, i) + 1);
        }
        std::vector<P2POp> ops = {P2POp::Send(to_right.buffer(), right, 1), P2POp::Send(to_left.buffer(), left, 2),
                                  P2POp::Recv(from_left.buffer(), left, 1), P2POp::Recv(from_right.buffer(), right, 2)};
        comm.p2p(ops)->wait();
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(from_left.get(i), A2AValue(left, me, i));
          ASSERT_EQ(from_right.get(i), A2AValue(right, me, i) + 1);
        }
      }
    }
    // Plain send/recv, posted recv-first on odd ranks and send-first on even ranks.
    TypedArray out(DType::kInt64, 3), in(DType::kInt64, 3);
    for (int i = 0; i < 3; ++i) out.set(i, me * 100 + i);
    const int peer = me ^ 1;
    if (peer < n) {
      auto r = me % 2 ? comm.recv(in.buffer(), peer, 9) : nullptr;
      auto s = comm.send(out.buffer(), peer, 9);
      if (!r) r = comm.recv(in.buffer(), peer, 9);
      s->wait();
      r->wait();
      EXPECT_TRUE(r->is_completed());
      for (int i = 0; i < 3; ++i) EXPECT_EQ(in.get(i), peer * 100 + i);
    }
    const TrafficCounters t = comm.traffic();
    EXPECT_GT(t.p2p_bytes_sent, 0u);
    EXPECT_EQ(t.p2p_bytes_sent, t.p2p_bytes_received) << "every p2p exchange here is symmetric";
  });
}

// Separately posted sends and receives complete whatever order they were posted in, and a
// receive whose sender is late does not hold back one whose payload has arrived.
TEST(PointToPointProgressTest, NonblockingOperationsPostedInAnyOrderComplete) {
  for (LaunchMode mode : {LaunchMode::kThreads, LaunchMode::kProcesses}) {
    RunRanks(4, mode, [](Communicator& comm) {
      const int n = comm.size(), me = comm.rank();
      const int right = (me + 1) % n, left = (me - 1 + n) % n;
      // Sends with tags 1, 2 to the right; receives posted in the opposite tag order.
      TypedArray a(DType::kFloat32, 33), b(DType::kFloat32, 5), got_a(DType::kFloat32, 33), got_b(DType::kFloat32, 5);
      for (size_t i = 0; i < 33; ++i) a.set(i, me * 1000 + i);
      for (size_t i = 0; i < 5; ++i) b.set(i, -me - 1.0 * i);
      auto s1 = comm.send(a.buffer(), right, 1);
      auto s2 = comm.send(b.buffer(), right, 2);
      auto r2 = comm.recv(got_b.buffer(), left, 2);
      auto r1 = comm.recv(got_a.buffer(), left, 1);
      for (auto& w : {s1, s2, r2, r1}) w->wait();
      for (size_t i = 0; i < 33; ++i) ASSERT_EQ(got_a.get(i), left * 1000 + i);
      for (size_t i = 0; i < 5; ++i) ASSERT_EQ(got_b.get(i), -left - 1.0 * i);
      // A chain: rank 0 posts receives from 1 then 2; rank 2 sends to 0 and waits before
      // sending to 1; rank 1 sends to 0 only after hearing from 2.
      TypedArray x(DType::kInt32, 9), y(DType::kInt32, 9);
      for (size_t i = 0; i < 9; ++i) x.set(i, me + 10 * i);
      if (me == 0) {
        auto from1 = comm.recv(y.buffer(), 1, 7);
        auto from2 = comm.recv(x.buffer(), 2, 7);
        from2->wait();
        from1->wait();
        EXPECT_EQ(x.get(3), 2 + 30);
        EXPECT_EQ(y.get(3), 1 + 30);
      } else if (me == 2) {
        comm.send(x.buffer(), 0, 7)->wait();
        comm.send(x.buffer(), 1, 7)->wait();
      } else if (me == 1) {
        comm.recv(y.buffer(), 2, 7)->wait();
        comm.send(x.buffer(), 0, 7)->wait();
      }
    });
  }
}

// Rank 0 receives one message from each other rank without naming the sender; each receive
// reports its sender, and every sender's payload arrives exactly once.
TEST(PointToPointProgressTest, ReceiveFromAnySourceReportsTheSender) {
  for (LaunchMode mode : {LaunchMode::kThreads, LaunchMode::kProcesses}) {
    RunRanks(4, mode, [](Communicator& comm) {
      const int n = comm.size(), me = comm.rank();
      if (me == 0) {
        std::vector<int> seen;
        for (int k = 1; k < n; ++k) {
          TypedArray got(DType::kInt64, 5);
          int source = -7;
          comm.recv_any_source(got.buffer(), 3, &source)->wait();
          ASSERT_GE(source, 1);
          ASSERT_LT(source, n);
          for (size_t i = 0; i < 5; ++i) ASSERT_EQ(got.get(i), source * 10 + i);
          seen.push_back(source);
        }
        std::sort(seen.begin(), seen.end());
        EXPECT_EQ(seen, (std::vector<int>{1, 2, 3}));
      } else {
        TypedArray out(DType::kInt64, 5);
        for (size_t i = 0; i < 5; ++i) out.set(i, me * 10 + i);
        comm.send(out.buffer(), 0, 3)->wait();
      }
    });
  }
  // CUDA buffers and a world of one have no "any source": clear errors.
  RunRanks(1, LaunchMode::kThreads, [](Communicator& comm) {
    TypedArray got(DType::kInt64, 5);
    int source = 0;
    EXPECT_THROW(comm.recv_any_source(got.buffer(), 3, &source), InvalidArgumentError);
  });
}

// Above kDirectAllreduceMaxBytes all-reduce runs gossipcc's pipelined ring
// (comm/gloo/ring_allreduce.h). Its layout depends on n (n chunks of S >= 2 segments of at most
// 1 MiB each), so it runs at every n, every element checked: a count just past the line
// (chunks and segments of unequal length) with every dtype and op (avg: floating point
// only), and on up to 4 ranks a float32 buffer whose chunks take three segments.
// LargeTest runs 64 MB (16 segments per chunk).
// Under sanitizers each n runs a third of the (dtype, op) pairs: (dtype index + op index + n)
// % 3 == 0. The ring's layout depends on n only and its reduction kernel on (dtype, op) only;
// every n still runs every dtype, and every op but avg (float32/float64 only: not at n = 3, 6),
// and the sweep's n (threads 2, 3, 4, 6, 8) span all residues mod 3, so every pair still runs
// on the ring at some n.
TEST_P(CollectivesTest, AllreduceOnTheRingEveryDtypeOpAndSegmentation) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    const int n = comm.size();
    int dtype_index = -1;
    for (DType dtype : AllDTypes()) {
      ++dtype_index;
      if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) continue;  // direct at every size
      int op_index = -1;
      for (ReduceOp op : kOps) {
        ++op_index;
        if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) continue;  // rejected: see errors test
        if (kSanitizerBuild && (dtype_index + op_index + n) % 3 != 0) continue;
        ASSERT_NO_FATAL_FAILURE(
            AllreduceAndCheckEveryElement(comm, dtype, op, kDirectAllreduceMaxBytes / ElementSize(dtype) + 3));
      }
    }
    if (n <= 4) {
      const size_t three_segments = (size_t{5} << 19) * n / sizeof(float) + 2 * n + 1;  // 2.5 MiB chunks
      ASSERT_NO_FATAL_FAILURE(AllreduceAndCheckEveryElement(comm, DType::kFloat32, ReduceOp::kSum, three_segments));
    }
  });
}

// Floating-point sums depend on the order of the terms; every rank must still hold the same
// bits, on the eager path (ranks combined in rank order) and on the ring alike.
TEST_P(CollectivesTest, AllreduceResultsAreBitwiseEqualOnEveryRank) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    const int n = comm.size();
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
      std::vector<size_t> counts = Sizes(n, dtype);
      counts.push_back(kDirectAllreduceMaxBytes / ElementSize(dtype) + 3);  // the ring (direct for half)
      for (size_t count : counts) {
        TypedArray a(dtype, count);
        for (size_t i = 0; i < count; ++i) a.set(i, std::sin(0.37 * static_cast<double>(i) + comm.rank()) / 3.0);
        comm.allreduce(a.buffer(), ReduceOp::kAvg)->wait();
        TypedArray all(dtype, count * n);
        comm.allgather(a.buffer(), all.buffer())->wait();
        const size_t bytes = a.buffer().bytes();
        const auto* first = static_cast<const uint8_t*>(all.buffer().data);
        for (int r = 1; r < n; ++r) {
          ASSERT_EQ(std::memcmp(first, first + r * bytes, bytes), 0)
              << DTypeName(dtype) << " count " << count << ": rank " << r << " differs from rank 0";
        }
      }
    }
  });
}

TEST_P(CollectivesTest, ManyOutstandingOperationsAllComplete) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    std::vector<TypedArray> arrays;
    for (int k = 0; k < 32; ++k) {
      arrays.emplace_back(DType::kInt32, 17);
      for (size_t i = 0; i < 17; ++i) arrays.back().set(i, k + comm.rank());
    }
    std::vector<std::shared_ptr<Work>> works;
    for (auto& a : arrays) works.push_back(comm.allreduce(a.buffer(), ReduceOp::kMax));
    for (auto& w : works) w->wait();
    for (int k = 0; k < 32; ++k) EXPECT_EQ(arrays[k].get(16), k + comm.size() - 1);
  });
}

// A wait() on a collective that is not next in its lane leaves it to the lane's worker;
// waiting on them in any order, different on each rank, completes all.
TEST_P(CollectivesTest, WaitingInAnyOrderCompletesEveryCollective) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    const int n = comm.size();
    std::vector<std::vector<int64_t>> data(6, std::vector<int64_t>(5, comm.rank() + 1));
    std::vector<std::shared_ptr<Work>> works;
    for (auto& d : data) works.push_back(comm.allreduce(CpuBuffer(d.data(), d.size())));
    for (size_t k = 0; k < works.size(); ++k) works[(k * 5 + comm.rank()) % works.size()]->wait();
    for (auto& d : data) EXPECT_EQ(d[4], n * (n + 1) / 2);
  });
}

// Every signature check announces the next check's receives (consistency_check.h), so the
// headers and eager payloads of a rank's next collective can land before the rank gets there,
// in the other of the check's two buffers. One rank lagging every other collective, eager and
// larger collectives interleaved: each collective must still read its own payloads.
TEST_P(CollectivesTest, PayloadsThatArriveBeforeTheRankStayWithTheirCollective) {
  RunRanks(n(), mode(), [](Communicator& comm) {
    const int n = comm.size();
    const int me = comm.rank();
    const size_t eager = std::max<size_t>(EagerCollectiveMaxBytes(n) / sizeof(int64_t), 1);
    for (int k = 0; k < 12; ++k) {
      if (me == n - 1 && k % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const size_t count = k % 3 == 2 ? eager + 1 : std::min<size_t>(eager, 9);
      std::vector<int64_t> v(count, 1000 * k + me);
      comm.allreduce(CpuBuffer(v.data(), count))->wait();
      const int64_t expected = int64_t{1000} * k * n + n * (n - 1) / 2;
      EXPECT_EQ(v.front(), expected) << "collective " << k;
      EXPECT_EQ(v.back(), expected) << "collective " << k;
    }
  });
}

// Collectives issued without waiting run on CommunicatorOptions::collective_lanes lanes, but
// take effect in issue order: each starts only after every earlier one touching the same
// memory. A chain of collectives on overlapping and disjoint parts of three buffers, at an
// eager, a direct and a ring size, on 1, 2 and 3 lanes, each rank waiting in reverse order:
// every result is the one of running them one by one.
// Under sanitizers on 1 and 3 lanes only: one lane (no overlap) and several (collectives on
// other lanes than the ones they must follow); 2 lanes take the same ordering code as 3.
std::vector<int> OverlapLaneCounts() {
  if (kSanitizerBuild) return {1, 3};
  return {1, 2, 3};
}

TEST_P(CollectivesTest, OverlappingCollectivesInFlightTakeEffectInIssueOrder) {
  for (int lanes : OverlapLaneCounts()) {
    CommunicatorOptions options;
    options.collective_lanes = lanes;
    RunRanks(n(), mode(), [lanes](Communicator& comm) {
      const int n = comm.size();
      const int me = comm.rank();
      const int64_t S = n * (n + 1) / 2;
      const size_t eager = EagerCollectiveMaxBytes(n) / sizeof(int64_t);
      for (size_t half : {size_t{5}, eager / 2 + 1, size_t{(768u << 10) / sizeof(int64_t)}}) {
        const size_t m = half;  // x = [x_head | x_tail], each m elements; y = n blocks of m
        std::vector<int64_t> x(2 * m), y(static_cast<size_t>(n) * m), g(static_cast<size_t>(n) * m, -1);
        for (size_t i = 0; i < x.size(); ++i) x[i] = me + 1 + static_cast<int64_t>(i % 7);
        for (size_t i = 0; i < y.size(); ++i) y[i] = 10 * (me + 1) + static_cast<int64_t>(i % 5);
        const Buffer xb = CpuBuffer(x.data(), x.size()), yb = CpuBuffer(y.data(), y.size());
        const Buffer x_head = CpuBuffer(x.data(), m), x_tail = CpuBuffer(x.data() + m, m);
        const Buffer gb = CpuBuffer(g.data(), g.size());
        std::vector<std::shared_ptr<Work>> works;
        works.push_back(comm.allreduce(xb));                 // x = S + n (i % 7)
        works.push_back(comm.allreduce(yb));                 // y = 10 S + n (i % 5), disjoint from x
        works.push_back(comm.allreduce(xb));                 // x = n (S + n (i % 7)): after the first
        works.push_back(comm.allgather(x_head, gb));         // g = n copies of x_head, as of the second
        works.push_back(comm.reduce_scatter(yb, x_tail));    // x_tail = n y[me m + i]: after y's sum
        works.push_back(comm.barrier());
        works.push_back(comm.allreduce(gb));                 // g = n g
        for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
        const std::string where = absl::StrCat("lanes ", lanes, ", m ", m, ", rank ", me);
        for (size_t i = 0; i < m; ++i) {
          const int64_t x_after = n * (S + n * static_cast<int64_t>(i % 7));
          const int64_t y_expected = 10 * S + n * static_cast<int64_t>(i % 5);
          const int64_t tail = n * (10 * S + n * static_cast<int64_t>((me * m + i) % 5));
          if (x[i] != x_after || x[m + i] != tail || y[i] != y_expected) {
            FAIL() << where << ", index " << i << ": x_head " << x[i] << " (expected " << x_after << "), x_tail "
                   << x[m + i] << " (expected " << tail << "), y " << y[i] << " (expected " << y_expected << ")";
          }
          for (int r = 0; r < n; ++r) {
            if (g[r * m + i] != n * x_after) {
              FAIL() << where << ", g block " << r << " index " << i << ": " << g[r * m + i] << " (expected "
                     << n * x_after << ")";
            }
          }
        }
      }
    }, options);
  }
}

// A barrier is a fence across lanes: waiting on it means every collective issued before it
// has completed on this rank (as with ProcessGroupGloo's barrier), here a ring-sized
// all-reduce and a direct one on other lanes than the barrier's.
TEST_P(CollectivesTest, BarrierCompletesAfterEveryEarlierCollective) {
  CommunicatorOptions options;
  options.collective_lanes = 3;
  RunRanks(n(), mode(), [](Communicator& comm) {
    std::vector<float> big((3u << 20) / sizeof(float), 1.0f), mid((256u << 10) / sizeof(float), 1.0f);
    for (int k = 0; k < 3; ++k) {
      auto first = comm.allreduce(CpuBuffer(big.data(), big.size()));
      auto second = comm.allreduce(CpuBuffer(mid.data(), mid.size()));
      comm.barrier()->wait();
      EXPECT_TRUE(first->is_completed()) << "round " << k << ": barrier done before the earlier all-reduce";
      EXPECT_TRUE(second->is_completed()) << "round " << k << ": barrier done before the earlier all-reduce";
      first->wait();
      second->wait();
    }
    const float expected = std::pow(static_cast<float>(comm.size()), 3.0f);
    EXPECT_EQ(big.front(), expected);
    EXPECT_EQ(mid.back(), expected);
  }, options);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest,
                         ::testing::ValuesIn(RankSweep()),  // every n; process mode at a few (harness.h)
                         ModeAndRanksName);

TEST(CollectiveLanesOptionTest, OutOfRangeLaneCountsAreRejected) {
  for (int bad : {0, -1, kMaxCollectiveLanes + 1}) {
    CommunicatorOptions options;
    options.collective_lanes = bad;
    try {
      Communicator::Create(MakeHashStore(), 0, 1, options);
      ADD_FAILURE() << "collective_lanes " << bad << " accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_THAT(std::string(e.what()),
                  HasSubstr(absl::StrCat("collective_lanes must be in [1, ", kMaxCollectiveLanes, "], got ", bad)));
    }
  }
}

// Ranks with different lane counts would connect different meshes and put collectives on
// different lanes: every rank fails at creation, naming the setting and who differs, grouped
// by value (ranks 0 and 3 agree with each other, 1 and 2 each have a count of their own).
TEST(CollectiveLanesOptionTest, RanksThatDisagreeFailAtCreation) {
  const int lanes_of[] = {2, 3, 1, 2};
  const char* expected[] = {"is 2 here but 1 on rank(s) 2; 3 on rank(s) 1;", "is 3 here but 1 on rank(s) 2; 2 on rank(s) 0, 3;",
                            "is 1 here but 2 on rank(s) 0, 3; 3 on rank(s) 1;", "is 2 here but 1 on rank(s) 2; 3 on rank(s) 1;"};
  ExpectCreateFailsOnEveryRank(
      4,
      [&](int rank) {
        CommunicatorOptions options;
        options.collective_lanes = lanes_of[rank];
        return options;
      },
      "collective_lanes", [&](int rank) { return std::string(expected[rank]); });
}

// A rank that skips the signature check would leave its peers waiting for its header (a 4 MiB
// all-reduce hung both ranks past the timeout): every rank fails at creation instead.
TEST(VerifyCollectivesOptionTest, RanksThatDisagreeFailAtCreation) {
  ExpectCreateFailsOnEveryRank(
      3,
      [](int rank) {
        CommunicatorOptions options;
        options.verify_collectives = rank != 2;
        return options;
      },
      "verify_collectives", [](int rank) {
        return std::string(rank == 2 ? "is false here but true on rank(s) 0, 1;" : "is true here but false on rank(s) 2;");
      });
}

// 64 MB per rank: the size where chunking, segmenting and socket buffers all matter.
// Under sanitizers 16 MB (kLargeBytes), still far above every size threshold (eager 128 KiB,
// direct all-reduce 512 KiB, direct slice 4 MiB): the ring all-reduce has 4 segments of 1 MiB
// per chunk on 4 ranks (at least kRingWindow, so its receive slots are reused), the direct
// reduce-scatter 4 slices, point-to-point 64 segments of 256 KiB, and the uneven
// all-gatherv counts stay uneven.
class LargeTest : public ::testing::TestWithParam<LaunchMode> {};
constexpr size_t kLargeBytes = kSanitizerBuild ? size_t{16} << 20 : size_t{64} << 20;

TEST_P(LargeTest, Allreduce64MBFloat32OnFourRanks) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    const size_t count = kLargeBytes / sizeof(float);
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((i % 1000) * (comm.rank() + 1));
    comm.allreduce(CpuBuffer(data.data(), count), ReduceOp::kSum)->wait();
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != static_cast<float>((i % 1000) * 10)) FAIL() << "index " << i << ": " << data[i];
    }
  });
}

TEST_P(LargeTest, ReduceScatterAndAllgather64MBOnFourRanks) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    const size_t chunk = kLargeBytes / 4 / sizeof(double);  // 64 MB in, 64 MB gathered
    std::vector<double> in(chunk * 4), out(chunk), gathered(chunk * 4);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<double>(i % 977) + comm.rank();
    comm.reduce_scatter(CpuBuffer(in.data(), in.size()), CpuBuffer(out.data(), chunk), ReduceOp::kSum)->wait();
    comm.allgather(CpuBuffer(out.data(), chunk), CpuBuffer(gathered.data(), gathered.size()))->wait();
    for (size_t i = 0; i < gathered.size(); ++i) {
      if (gathered[i] != 4.0 * static_cast<double>(i % 977) + 6.0) FAIL() << "index " << i << ": " << gathered[i];
    }
  });
}

// The remaining collectives and point-to-point at 64 MB (every data path: Gloo's broadcast,
// all-to-all and all-gatherv, segmented point-to-point on the per-direction connections).
TEST_P(LargeTest, BroadcastAlltoallAllgathervAndPointToPoint64MBOnFourRanks) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    const int me = comm.rank(), n = comm.size();
    const size_t count = kLargeBytes / sizeof(float), block = count / n;
    auto pattern = [](size_t i) { return static_cast<float>(i % 1013); };
    std::vector<float> data(count, -1.0f), other(count);
    if (me == 2) for (size_t i = 0; i < count; ++i) data[i] = pattern(i);
    comm.broadcast(CpuBuffer(data.data(), count), 2)->wait();
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != pattern(i)) FAIL() << "broadcast index " << i << ": " << data[i];
    }
    // all-to-all: block j of rank r's input goes to rank j's block r.
    auto a2a = [](int from, int to, size_t i) { return static_cast<float>(from * 10 + to + (i % 7) * 100); };
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < block; ++i) data[j * block + i] = a2a(me, j, i);
    comm.alltoall(CpuBuffer(data.data(), count), CpuBuffer(other.data(), count))->wait();
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < block; ++i) {
        if (other[j * block + i] != a2a(j, me, i)) FAIL() << "alltoall block " << j << " index " << i;
      }
    // all-gatherv with unequal counts summing to 64 MB.
    std::vector<size_t> counts(n, block + 1);
    counts[0] = count - (n - 1) * (block + 1);
    std::vector<float> mine(counts[me], static_cast<float>(me + 1));
    comm.allgatherv(CpuBuffer(mine.data(), mine.size()), CpuBuffer(other.data(), count), counts)->wait();
    size_t at = 0;
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < counts[r]; ++i, ++at) {
        if (other[at] != static_cast<float>(r + 1)) FAIL() << "allgatherv from rank " << r << " index " << i;
      }
    // Point-to-point ring: 64 MB to the next rank while receiving 64 MB from the previous.
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(me) + pattern(i);
    auto sent = comm.send(CpuBuffer(data.data(), count), (me + 1) % n, 7);
    auto got = comm.recv(CpuBuffer(other.data(), count), (me + n - 1) % n, 7);
    sent->wait();
    got->wait();
    const float from = static_cast<float>((me + n - 1) % n);
    for (size_t i = 0; i < count; ++i) {
      if (other[i] != from + pattern(i)) FAIL() << "recv index " << i << ": " << other[i];
    }
  });
}

// float16/bfloat16 above kDirectSliceBytes: the direct algorithm in several slices, the last
// one short. Rank 0 contributes a value where the dtype's spacing is 2, the others 0..2, so
// adding in the dtype's own precision would round at every step (2048 + 1 + 1 + 1 stays 2048
// in float16) while accumulating in float32 and rounding once gives the correctly rounded
// sum: every element must equal it exactly, on every rank.
// Under sanitizers two slices instead of three (kHalfSlices): the first full, the last short,
// so the next slice's reduce-scatter still runs while the previous slice's all-gather is in
// flight and the staging is reused; a middle slice takes the same loop iteration as the first.
constexpr size_t kHalfSlices = kSanitizerBuild ? 1 : 2;

TEST_P(LargeTest, HalfPrecisionAllreduceAndReduceScatterAccumulateWideInSlices) {
  RunRanks(4, GetParam(), [](Communicator& comm) {
    const int n = comm.size();
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const double big = dtype == DType::kFloat16 ? 2048 : 256;
      auto value = [&](int r, size_t i) { return r == 0 ? big : static_cast<double>((i + r) % 3); };
      auto rounded_sum = [&](size_t i) {
        double sum = 0;
        for (int r = 0; r < n; ++r) sum += value(r, i);
        TypedArray once(dtype, 1);
        once.set(0, sum);
        return once.get(0);
      };
      // value(r, i), so the rounded sum, depends on i % 3 only: computed once per residue
      // instead of per element (a TypedArray each time: most of this case's time under ASan).
      const double expected[3] = {rounded_sum(0), rounded_sum(1), rounded_sum(2)};
      const size_t count = kHalfSlices * kDirectSliceBytes / ElementSize(dtype) + 12345;
      TypedArray a(dtype, count);
      for (size_t i = 0; i < count; ++i) a.set(i, value(comm.rank(), i));
      comm.allreduce(a.buffer(), ReduceOp::kSum)->wait();
      for (size_t i = 0; i < count; ++i) {
        if (a.get(i) != expected[i % 3]) FAIL() << DTypeName(dtype) << " allreduce index " << i << ": " << a.get(i);
      }
      const size_t block = kDirectSliceBytes / ElementSize(dtype) / n * kHalfSlices + 101;
      TypedArray in(dtype, block * n), out(dtype, block);
      for (size_t i = 0; i < block * n; ++i) in.set(i, value(comm.rank(), i));
      comm.reduce_scatter(in.buffer(), out.buffer(), ReduceOp::kSum)->wait();
      for (size_t i = 0; i < block; ++i) {
        const size_t global = comm.rank() * block + i;
        if (out.get(i) != expected[global % 3]) {
          FAIL() << DTypeName(dtype) << " reduce_scatter index " << global << ": " << out.get(i);
        }
      }
    }
  });
}

// KeepUntilClosed: memory a failed operation's receives may still be posted on lives until the
// communicator's connections are gone, not until the caller lets go of it.
TEST(KeepUntilClosedTest, MemoryIsFreedOnlyOnceTheConnectionsAreClosed) {
  RunRanks(2, LaunchMode::kThreads, [](Communicator& comm) {
    auto freed = std::make_shared<std::atomic<bool>>(false);
    comm.KeepUntilClosed(std::shared_ptr<void>(new std::vector<uint8_t>(1 << 20), [freed](void* p) {
      delete static_cast<std::vector<uint8_t>*>(p);
      freed->store(true);
    }));
    comm.barrier()->wait();
    EXPECT_FALSE(freed->load()) << "freed while the communicator is open";
    comm.shutdown();
    EXPECT_TRUE(freed->load()) << "still held after shutdown() closed the connections";
  });
}

// Both modes in the plain build; threads only under a sanitizer, where each 64 MB case takes
// 4-17 s: the 64 MB code paths are the same in both modes, and the process mode's own paths
// (fork, FileStore) run under AddressSanitizer in the rank sweep (RankSweep in harness.h).
std::vector<LaunchMode> LargeModes() {
  if (kSanitizerBuild) return {LaunchMode::kThreads};
  return {LaunchMode::kThreads, LaunchMode::kProcesses};
}

INSTANTIATE_TEST_SUITE_P(Modes, LargeTest, ::testing::ValuesIn(LargeModes()),
                         [](const ::testing::TestParamInfo<LaunchMode>& info) { return LaunchModeName(info.param); });

}  // namespace
}  // namespace testing
}  // namespace gossipcc
