// A rank killed (SIGKILL) or stopped (SIGSTOP) in the middle of each kind of operation: exact
// collectives (Gloo's algorithms and gossipcc's own), point-to-point, push-sum, bilateral exchange and PowerSGD, on CPU, 4 ranks as
// separate processes. The victim raises the signal on itself from a helper thread while its
// main thread is inside the same loop of operations as everyone else's. Every survivor must
// get a CommError that names the victim ("rank 2 is not responding"), within the timeout plus
// the peer check, then shut its communicator down and exit normally (exit status 0).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "algorithms/bilateral_exchange.h"
#include "algorithms/peer_graph.h"
#include "algorithms/push_sum.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "compression/power_sgd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"

namespace gossipcc {
namespace testing {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

constexpr int kRanks = 4;
constexpr int kVictim = 2;
constexpr Ms kTimeout{1500};
// A failing operation takes up to its own timeout, then the peer check (3-4 heartbeat intervals
// of 150 ms, 6 if this rank's own heartbeat is late): about 2.4 s, which each survivor prints.
// The bounds below are safety nets 10x the timeout (against a wait that ignores it, or a
// shutdown that hangs on the dead peer), not speed checks: a loaded 2-core machine under TSan
// must not break them.
constexpr Ms kFailureBound = 10 * kTimeout;
constexpr Ms kShutdownBound = 10 * kTimeout;
// Each survivor fails and shuts down within these; the test waits for it this long.
constexpr std::chrono::seconds kSurvivorDeadline{120};

// One operation of the loop, and the state it keeps across iterations.
using Op = std::function<void(Communicator&)>;
using OpFactory = std::function<Op(int rank)>;

struct OpCase {
  std::string name;
  OpFactory make;
  bool lossless_float32_allreduce = false;  // CommunicatorOptions of every rank
};

std::vector<OpCase> Cases() {
  return {
      {"allreduce",
       [](int) {
         auto data = std::make_shared<std::vector<float>>(1 << 20, 1.0f);
         return [data](Communicator& c) { c.allreduce(CpuBuffer(data->data(), data->size()))->wait(); };
       }},
      // Two consecutive all-reduces on disjoint memory: in flight at once, on two lanes
      // (CommunicatorOptions::collective_lanes). Each that fails must name the victim (the one
      // that was further along may have completed before the victim stopped).
      {"allreduce_two_lanes",
       [](int) {
         auto a = std::make_shared<std::vector<float>>(1 << 20, 1.0f);
         auto b = std::make_shared<std::vector<float>>(1 << 19, 1.0f);
         return [a, b](Communicator& c) {
           const std::shared_ptr<Work> works[] = {c.allreduce(CpuBuffer(a->data(), a->size())),
                                                  c.allreduce(CpuBuffer(b->data(), b->size()))};
           std::exception_ptr first;
           for (const auto& w : works) {
             try {
               w->wait();
             } catch (const CommError& e) {
               EXPECT_THAT(e.what(), HasSubstr(absl::StrCat("rank ", kVictim, " is not responding")));
               if (!first) first = std::current_exception();
             }
           }
           if (first) std::rethrow_exception(first);
         };
       }},
      // The packed ring (comm/gloo/packed_ring_allreduce.h): its sends come from slots of its own.
      {"allreduce_packed",
       [](int) {
         auto data = std::make_shared<std::vector<float>>(1 << 20, 1.0f);
         return [data](Communicator& c) { c.allreduce(CpuBuffer(data->data(), data->size()))->wait(); };
       },
       true},
      // Half precision takes gossipcc's own direct all-reduce (not the ring) at every size.
      {"allreduce_float16",
       [](int) {
         auto data = std::make_shared<std::vector<uint16_t>>(1 << 20, 0x3c00);  // 1.0
         return [data](Communicator& c) {
           c.allreduce(Buffer{data->data(), data->size(), DType::kFloat16, Device::CPU()})->wait();
         };
       }},
      // float32 reduce-scatter takes gossipcc's own ring.
      {"reduce_scatter",
       [](int) {
         auto in = std::make_shared<std::vector<float>>(kRanks << 18, 1.0f);
         auto out = std::make_shared<std::vector<float>>(1 << 18);
         return [in, out](Communicator& c) {
           c.reduce_scatter(CpuBuffer(in->data(), in->size()), CpuBuffer(out->data(), out->size()))->wait();
         };
       }},
      {"allgather",
       [](int) {
         auto in = std::make_shared<std::vector<float>>(1 << 18, 1.0f);
         auto out = std::make_shared<std::vector<float>>(kRanks << 18);
         return [in, out](Communicator& c) {
           c.allgather(CpuBuffer(in->data(), in->size()), CpuBuffer(out->data(), out->size()))->wait();
         };
       }},
      {"broadcast",
       [](int) {
         auto data = std::make_shared<std::vector<float>>(1 << 20, 1.0f);
         return [data](Communicator& c) { c.broadcast(CpuBuffer(data->data(), data->size()), 0)->wait(); };
       }},
      {"p2p_ring",
       [](int) {
         auto out = std::make_shared<std::vector<float>>(1 << 20, 1.0f);
         auto in = std::make_shared<std::vector<float>>(1 << 20);
         return [out, in](Communicator& c) {
           const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
           std::vector<P2POp> ops = {P2POp::Send(CpuBuffer(out->data(), out->size()), next, 7),
                                     P2POp::Recv(CpuBuffer(in->data(), in->size()), prev, 7)};
           c.p2p(ops)->wait();
         };
       }},
      {"push_sum",
       [](int rank) {
         auto ps = std::make_shared<PushSum>(MakePeerGraph("exponential", kRanks));
         auto x = std::make_shared<std::vector<double>>(1 << 18, rank + 1.0);
         return [ps, x](Communicator& c) { ps->Step(c, {CpuBuffer(x->data(), x->size())}); };
       }},
      {"bilateral",
       [](int rank) {
         auto bx = std::make_shared<BilateralExchange>(MakePeerGraph("hypercube", kRanks));
         auto x = std::make_shared<std::vector<float>>(1 << 19, rank + 1.0f);
         return [bx, x](Communicator& c) { bx->Step(c, {CpuBuffer(x->data(), x->size())}); };
       }},
      {"powersgd",
       [](int rank) {
         compression::PowerSGDOptions o;
         o.matrix_approximation_rank = 2;
         o.start_powerSGD_iter = 1;
         auto psgd = std::make_shared<compression::PowerSGD>(o);
         auto w = std::make_shared<std::vector<float>>(512 * 512, rank + 0.5f);
         auto b = std::make_shared<std::vector<float>>(512, 1.0f);
         return [psgd, w, b](Communicator& c) {
           for (size_t i = 0; i < w->size(); i += 97) (*w)[i] += 0.25f;  // something new to compress
           std::vector<compression::GradientTensor> grads = {{"w", CpuBuffer(w->data(), w->size()), {512, 512}},
                                                             {"b", CpuBuffer(b->data(), b->size()), {512}}};
           psgd->AllReduce(c, grads);
         };
       }},
  };
}

struct FaultParam {
  OpCase op;
  int signal;
};

std::string SignalName(int sig) { return sig == SIGKILL ? "SIGKILL" : "SIGSTOP"; }

// The body of one rank (a forked child); returns its exit status.
int RankMain(int rank, const std::string& dir, const FaultParam& p) {
  CommunicatorOptions options;
  options.timeout = kTimeout;
  options.rendezvous_timeout = std::chrono::seconds(60);  // a safety net: connecting may be slow
  options.lossless_float32_allreduce = p.op.lossless_float32_allreduce;
  std::shared_ptr<Store> store = MakeFileStore(dir);
  auto comm = Communicator::Create(store, rank, kRanks, options);
  Op op = p.op.make(rank);
  // kTimeout is short (a dead peer named quickly): the ranks meet before the first operation.
  testing::MeetThroughStore(*store, rank, kRanks, "started");
  comm->barrier()->wait();
  if (rank == kVictim) {
    // Mid-operation: the main thread is inside the loop below when this fires.
    std::thread([sig = p.signal] {
      std::this_thread::sleep_for(Ms(300));
      raise(sig);
    }).detach();
  }
  const auto loop_start = Clock::now();
  for (int i = 0;; ++i) {
    const auto start = Clock::now();
    try {
      op(*comm);
    } catch (const CommError& e) {
      const auto took = std::chrono::duration_cast<Ms>(Clock::now() - start);
      std::cout << p.op.name << "/" << SignalName(p.signal) << " rank " << rank << ", iteration " << i << ", after "
                << took.count() << " ms: " << e.what() << std::endl;
      EXPECT_NE(rank, kVictim) << "the victim's own operation failed";
      EXPECT_THAT(e.what(), HasSubstr(absl::StrCat("rank ", kVictim, " is not responding")));
      EXPECT_LT(took.count(), kFailureBound.count())
          << p.op.name << "/" << SignalName(p.signal) << " rank " << rank << ": failed after " << took.count()
          << " ms (timeout " << kTimeout.count() << " ms): " << e.what();
      EXPECT_EQ(dynamic_cast<const MismatchError*>(&e), nullptr) << "a dead peer is not a mismatch";
      break;
    }
    if (Clock::now() - loop_start > 2 * kFailureBound) {
      ADD_FAILURE() << p.op.name << "/" << SignalName(p.signal) << " rank " << rank << ": no error "
                    << (2 * kFailureBound).count() << " ms after the victim's " << SignalName(p.signal);
      break;
    }
  }
  // Clean shutdown with a dead peer: nothing may hang or crash from here on.
  const auto stop_start = Clock::now();
  comm->shutdown();
  comm.reset();
  const auto stop_took = std::chrono::duration_cast<Ms>(Clock::now() - stop_start);
  EXPECT_LT(stop_took.count(), kShutdownBound.count())
      << p.op.name << "/" << SignalName(p.signal) << " rank " << rank << ": shutdown took " << stop_took.count()
      << " ms with a dead peer (timeout " << kTimeout.count() << " ms)";
  return ::testing::Test::HasFailure() ? 1 : 0;
}

class DeadPeerTest : public ::testing::TestWithParam<FaultParam> {};

TEST_P(DeadPeerTest, SurvivorsNameThePeerWithinTheTimeoutAndExitCleanly) {
  const FaultParam& p = GetParam();
  const std::string dir = FreshTempDir();
  std::cout.flush();
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 3;
      try {
        code = RankMain(r, dir, p);
      } catch (const std::exception& e) {
        std::cerr << "rank " << r << " threw: " << e.what() << std::endl;
      }
      std::cout.flush();
      std::cerr.flush();
      _exit(code);
    }
    ASSERT_GT(pid, 0);
    pids.push_back(pid);
  }
  const auto deadline = Clock::now() + kSurvivorDeadline;
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(pids[r], &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(Ms(5));
    }
    if (got == 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status, 0);
      ADD_FAILURE() << CurrentTestName() << ": survivor rank " << r << " hung (killed after " << kSurvivorDeadline.count()
                    << " s)";
      continue;
    }
    if (WIFEXITED(status)) {
      EXPECT_EQ(WEXITSTATUS(status), 0) << CurrentTestName() << ": survivor rank " << r << " failed";
    } else {
      ADD_FAILURE() << CurrentTestName() << ": survivor rank " << r << " crashed with signal " << WTERMSIG(status);
    }
  }
  // The victim is dead (SIGKILL) or stopped (SIGSTOP): end it either way.
  kill(pids[kVictim], SIGKILL);
  int status = 0;
  waitpid(pids[kVictim], &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

// Every op with both faults; under a sanitizer (unless FullSuite()) each op with one of them, the
// other in the other sanitizer, alternating op by op so that each sanitizer sees both faults
// (LeftToTheOtherSanitizer in tests/comm/harness.h).
std::vector<FaultParam> AllFaults() {
  std::vector<FaultParam> out;
  int index = 0;
  for (const OpCase& c : Cases()) {
    for (int signal : {SIGKILL, SIGSTOP}) {
      const bool under_asan = (signal == SIGKILL) == (index % 2 == 0);
      if (!LeftToTheOtherSanitizer(under_asan ? Sanitizer::kAddress : Sanitizer::kThread)) out.push_back({c, signal});
    }
    ++index;
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Ops, DeadPeerTest, ::testing::ValuesIn(AllFaults()),
                         [](const ::testing::TestParamInfo<FaultParam>& info) {
                           return absl::StrCat(info.param.op.name, "_", info.param.signal == SIGKILL ? "kill" : "stop");
                         });

}  // namespace
}  // namespace testing
}  // namespace gossipcc
