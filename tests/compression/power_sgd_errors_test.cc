// Bad input and checkpoints: invalid tensors (raised on the calling rank before anything is
// sent), inconsistent tensor lists, shapes, options or step counts across ranks (MismatchError
// on every rank, nothing reduced, state unchanged), NaN/Inf (pass-through or error, state never
// corrupted), and checkpoints that resume bit-identically.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"
#include "compression/power_sgd.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"
#include "tests/comm/typed_array.h"
#include "tests/compression/reference.h"

namespace gossipcc {
namespace testing {
namespace {

using compression::GradientTensor;
using compression::NonFinitePolicy;
using compression::PowerSGD;
using compression::PowerSGDCheckpoint;
using compression::PowerSGDOptions;
using compression::PowerSGDStats;
using compression::PowerSGDTensorState;

// Owns float32 tensors for one call (views are made on demand, so copies stay valid).
struct Tensors {
  std::vector<std::vector<float>> data;
  std::vector<std::string> keys;
  std::vector<std::vector<int64_t>> shapes;

  Tensors& With(const std::string& key, std::vector<int64_t> shape, int rank, int step) {
    std::vector<float> v(Numel(shape));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(GradValue(99, rank, step, key, i));
    data.push_back(std::move(v));
    keys.push_back(key);
    shapes.push_back(std::move(shape));
    return *this;
  }
  std::vector<GradientTensor> list() {
    std::vector<GradientTensor> out;
    for (size_t t = 0; t < data.size(); ++t) out.push_back({keys[t], CpuBuffer(data[t].data(), data[t].size()), shapes[t]});
    return out;
  }
};

template <typename E>
std::string Expect(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "\"" << (haystack) << "\" lacks \"" << (needle) << "\""

PowerSGDOptions Compressing(int rank = 2) {
  PowerSGDOptions o;
  o.matrix_approximation_rank = rank;
  o.start_powerSGD_iter = 0;
  return o;
}

TEST(PowerSGDBadInputTest, InvalidTensorsAreRejectedBeforeAnythingIsSent) {
  auto comm = Communicator::Create(MakeHashStore(), 0, 1);
  PowerSGD psgd(Compressing());
  std::vector<float> f(24);
  std::vector<int32_t> ints(24);
  auto call = [&](std::vector<GradientTensor> list) { return Expect<InvalidArgumentError>([&] { psgd.AllReduce(*comm, list); }); };
  EXPECT_CONTAINS(call({{"w", CpuBuffer(f.data(), 24), {5, 5}}}), "shape [5, 5] has 25 elements but the buffer has 24");
  EXPECT_CONTAINS(call({{"w", CpuBuffer(f.data(), 24), {-4, -6}}}), "negative dimension");
  EXPECT_CONTAINS(call({{"w", CpuBuffer(ints.data(), 24), {4, 6}}}), "has dtype int32; PowerSGD averages float32");
  EXPECT_CONTAINS(call({{"w", CpuBuffer(f.data(), 12), {12}}, {"w", CpuBuffer(f.data() + 12, 12), {12}}}),
                  "key \"w\" appears twice");
  EXPECT_CONTAINS(call({{"", CpuBuffer(f.data(), 24), {24}}}), "tensor 0 has an empty key");
  EXPECT_CONTAINS(call({{"w", Buffer{nullptr, 24, DType::kFloat32, Device::CPU()}, {24}}}), "has null data");
  EXPECT_CONTAINS(call({{"a", CpuBuffer(f.data(), 12), {12}}, {"b", Buffer{f.data(), 12, DType::kFloat32, Device::CUDA(0)}, {12}}}),
                  "one call takes tensors of one device");
  // CUDA tensors without a usable GPU (this machine has none; nccl_test covers GPU machines).
  const std::string cuda = call({{"w", Buffer{f.data(), 24, DType::kFloat32, Device::CUDA(0)}, {4, 6}}});
  EXPECT_TRUE(cuda.find("CUDA device(s) are visible") != std::string::npos || cuda.find("built without CUDA") != std::string::npos)
      << cuda;
  // Element counts that overflow 64 bits: 3 * 6148914691236517206 wraps to 2 (mod 2^64), so
  // an unchecked product would match the 2-element buffer.
  const std::string wrapped = call({{"w", CpuBuffer(f.data(), 2), {3, 6148914691236517206}}});
  EXPECT_CONTAINS(wrapped, "tensor 0 (\"w\"): the element count of shape [3, 6148914691236517206] overflows int64");
  EXPECT_CONTAINS(call({{"b", CpuBuffer(f.data(), 4), {4}}, {"conv", CpuBuffer(f.data(), 0), {1 << 22, 1 << 22, 1 << 22}}}),
                  "tensor 1 (\"conv\"): the element count of shape [4194304, 4194304, 4194304] overflows int64");
  // A negative dimension whose product looks right (-4 * -6 = 24), and one beside a zero.
  EXPECT_CONTAINS(call({{"w", CpuBuffer(f.data(), 0), {0, -6}}}), "tensor 0 (\"w\"): shape [0, -6] has a negative dimension");
  EXPECT_EQ(comm->traffic().collective_payload_bytes, 0u) << "nothing may be sent for invalid input";
  EXPECT_TRUE(psgd.SaveState().tensors.empty()) << "no state for invalid input";
  // A zero dimension makes the count 0 even when the other dimensions' product would overflow.
  std::vector<GradientTensor> empty = {{"e", Buffer{f.data(), 0, DType::kFloat32, Device::CPU()}, {int64_t{1} << 40, int64_t{1} << 40, 0}}};
  EXPECT_EQ(psgd.AllReduce(*comm, empty).tensors, 1u);
  // A key must keep its shape.
  psgd.AllReduce(*comm, std::vector<GradientTensor>{{"w", CpuBuffer(f.data(), 24), {4, 6}}});
  EXPECT_CONTAINS(call({{"w", CpuBuffer(f.data(), 24), {6, 4}}}), "earlier calls gave [4, 6] float32");
}

// Shapes whose element count overflows 64 bits, or with a negative dimension, are refused by
// every function that multiplies dimensions, naming the tensor and the shape.
TEST(PowerSGDBadInputTest, ShapeHelpersRejectOverflowingAndNegativeShapes) {
  PowerSGDOptions o;
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { PowerSGD::ShouldCompress({3, 6148914691236517206}, o); }),
                  "PowerSGD::ShouldCompress: the element count of shape [3, 6148914691236517206] overflows int64");
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { PowerSGD::ShouldCompress({4, -6}, o); }),
                  "shape [4, -6] has a negative dimension");
  EXPECT_FALSE(PowerSGD::ShouldCompress({int64_t{1} << 40, int64_t{1} << 40, 0}, o));  // empty, not an overflow
  // The largest count whose square fits int64, and the first that does not (that one used
  // to loop for ever: side * side wrapped around below the count).
  constexpr size_t kSide = 3037000499, kLargest = kSide * kSide;
  EXPECT_EQ(PowerSGD::FlatMatrixShape(kLargest), (std::vector<int64_t>{int64_t{kSide}, int64_t{kSide}}));
  EXPECT_EQ(PowerSGD::FlatMatrixShape(kLargest - 1), (std::vector<int64_t>{int64_t{kSide}, int64_t{kSide}}));
  for (size_t count : {kLargest + 1, std::numeric_limits<size_t>::max()}) {
    EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { PowerSGD::FlatMatrixShape(count); }), "overflows int64") << count;
  }
  // AllReduceFlat names the bucket, before anything is read or sent.
  auto comm = Communicator::Create(MakeHashStore(), 0, 1);
  PowerSGD psgd(Compressing());
  std::vector<float> f(16);
  std::vector<compression::FlatGradient> flat = {{"bucket0", CpuBuffer(f.data(), 16)},
                                                 {"bucket1", Buffer{f.data(), kLargest + 1, DType::kFloat32, Device::CPU()}}};
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { psgd.AllReduceFlat(*comm, flat); }),
                  "buffer 1 (\"bucket1\") has 9223372030926249002 elements: the element count of its square shape "
                  "[3037000500, 3037000500] (or larger) overflows int64");
  EXPECT_EQ(comm->traffic().collective_payload_bytes, 0u);
  EXPECT_TRUE(psgd.SaveState().tensors.empty());
}

// Rank `odd` passes something different; every rank must get MismatchError, nothing reduced,
// no state created, and the next consistent call must work.
// Every rank waits here before its communicator is shut down. Without it a rank that finished
// first and shut down could fail a slower peer still inside the same collective ("connection
// closed by peer", seen under TSan in process mode): these tests check the mismatch, not that.
void FinishTogether(Communicator& comm) { comm.barrier()->wait(); }

void ExpectMismatchEverywhere(LaunchMode mode, int n, const std::function<Tensors(int rank)>& make, const std::string& needle) {
  RunRanks(n, mode, [&](Communicator& comm) {
    PowerSGD psgd(Compressing());
    Tensors t = make(comm.rank());
    const std::vector<std::vector<float>> original = t.data;
    const std::string e = Expect<MismatchError>([&] { psgd.AllReduce(comm, t.list()); });
    EXPECT_CONTAINS(e, needle);
    EXPECT_CONTAINS(e, "no data was exchanged");
    EXPECT_EQ(t.data, original) << "inputs must be untouched";
    EXPECT_TRUE(psgd.SaveState().tensors.empty()) << "no state may be created";
    Tensors ok = Tensors().With("w", {4, 6}, comm.rank(), 0);
    EXPECT_EQ(psgd.AllReduce(comm, ok.list()).tensors, 1u);
    FinishTogether(comm);
  });
}

class PowerSGDMismatchTest : public ::testing::TestWithParam<LaunchMode> {};

TEST_P(PowerSGDMismatchTest, ShapeDifferingWithTheSameElementCount) {
  ExpectMismatchEverywhere(GetParam(), 3, [](int rank) {
    return Tensors().With("w", rank == 1 ? std::vector<int64_t>{6, 4} : std::vector<int64_t>{4, 6}, rank, 0).With("b", {5}, rank, 0);
  }, "ranks disagree on the tensor list (keys, order, shapes, dtypes or per-key step counts): rank 0: 2 tensors, 29 elements");
}

TEST_P(PowerSGDMismatchTest, DifferentTensorLists) {
  ExpectMismatchEverywhere(GetParam(), 3, [](int rank) {
    Tensors t;
    t.With("w", {4, 6}, rank, 0);
    if (rank == 2) t.With("extra", {3}, rank, 0);
    return t;
  }, "rank 2: 2 tensors, 27 elements");
}

TEST_P(PowerSGDMismatchTest, DifferentKeysOrOrder) {
  ExpectMismatchEverywhere(GetParam(), 2, [](int rank) {
    Tensors t;
    if (rank == 0) t.With("a", {4, 6}, rank, 0).With("b", {4, 6}, rank, 0);
    else t.With("b", {4, 6}, rank, 0).With("a", {4, 6}, rank, 0);
    return t;
  }, "ranks disagree on the tensor list");
}

TEST_P(PowerSGDMismatchTest, DifferentOptions) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    PowerSGD psgd(Compressing(comm.rank() == 0 ? 1 : 2));
    Tensors t = Tensors().With("w", {8, 8}, comm.rank(), 0);
    EXPECT_CONTAINS(Expect<MismatchError>([&] { psgd.AllReduce(comm, t.list()); }), "ranks use different PowerSGD options");
  });
}

TEST_P(PowerSGDMismatchTest, StateRestoredOnOneRankOnly) {
  RunRanks(2, GetParam(), [](Communicator& comm) {
    PowerSGD psgd(Compressing());
    if (comm.rank() == 0) {
      PowerSGDCheckpoint c;
      c.options = psgd.options();
      c.tensors["w"].shape = {8, 8};
      c.tensors["w"].steps = 5;
      psgd.LoadState(c);
    }
    Tensors t = Tensors().With("w", {8, 8}, comm.rank(), 0);
    EXPECT_CONTAINS(Expect<MismatchError>([&] { psgd.AllReduce(comm, t.list()); }), "per-key step counts");
    FinishTogether(comm);
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, PowerSGDMismatchTest, ::testing::ValuesIn(LaunchModes()),
                         [](const auto& info) { return LaunchModeName(info.param); });

// ---- NaN / Inf ----

std::vector<uint8_t> StateBytes(const PowerSGD& p) { 
  const std::string s = p.SaveState().Serialize();
  return std::vector<uint8_t>(s.begin(), s.end());
}

TEST(PowerSGDNonFiniteTest, PassThroughAveragesExactlyAndLeavesStateUntouched) {
  RunRanks(3, LaunchMode::kThreads, [](Communicator& comm) {
    PowerSGD psgd(Compressing()), twin(Compressing());  // twin never sees the bad step
    auto step = [&](PowerSGD& p, int s, bool poison) {
      Tensors t = Tensors().With("w", {12, 10}, comm.rank(), s).With("b", {7}, comm.rank(), s);
      if (poison && comm.rank() == 1) {
        t.data[0][5] = std::numeric_limits<float>::quiet_NaN();
        t.data[1][2] = std::numeric_limits<float>::infinity();
      }
      const PowerSGDStats st = p.AllReduce(comm, t.list());
      return std::make_pair(t.data, st);
    };
    step(psgd, 0, false);
    step(twin, 0, false);
    const std::vector<uint8_t> before = StateBytes(psgd);
    auto [out, stats] = step(psgd, 1, true);
    EXPECT_EQ(stats.nonfinite_calls, 1u);
    EXPECT_EQ(stats.compressed_tensors, 0u);
    EXPECT_EQ(StateBytes(psgd), before) << "state must be untouched by a NaN/Inf step";
    // Exact average everywhere else, NaN and Inf where they were.
    EXPECT_TRUE(std::isnan(out[0][5]));
    EXPECT_TRUE(std::isinf(out[1][2]));
    for (size_t i = 0; i < out[0].size(); ++i) {
      if (i == 5) continue;
      double ref = 0;
      for (int j = 0; j < comm.size(); ++j) ref += static_cast<float>(GradValue(99, j, 1, "w", i));
      ASSERT_NEAR(out[0][i], ref / comm.size(), 1e-6) << i;
    }
    // The next clean step equals that of an object that never saw the bad one.
    auto a = step(psgd, 2, false).first;
    auto b = step(twin, 2, false).first;
    EXPECT_EQ(a, b);
    EXPECT_EQ(psgd.total_stats().nonfinite_calls, 1u);
  });
}

TEST(PowerSGDNonFiniteTest, ErrorPolicyRaisesOnEveryRankAndChangesNothing) {
  RunRanks(3, LaunchMode::kProcesses, [](Communicator& comm) {
    PowerSGDOptions o = Compressing();
    o.nonfinite = NonFinitePolicy::kError;
    PowerSGD psgd(o);
    Tensors clean = Tensors().With("w", {12, 10}, comm.rank(), 0);
    psgd.AllReduce(comm, clean.list());
    const std::vector<uint8_t> before = StateBytes(psgd);
    Tensors t = Tensors().With("w", {12, 10}, comm.rank(), 1);
    if (comm.rank() == 2) t.data[0][0] = -std::numeric_limits<float>::infinity();
    const auto original = t.data;
    const std::string e = Expect<InvalidArgumentError>([&] { psgd.AllReduce(comm, t.list()); });
    EXPECT_CONTAINS(e, "NaN or Inf in the input (tensors with NaN/Inf per rank: rank 2: 1");
    EXPECT_CONTAINS(e, "the PowerSGD state is unchanged");
    if (comm.rank() == 2) {
      EXPECT_CONTAINS(e, "here: \"w\"");
    }
    EXPECT_EQ(t.data.size(), original.size());
    for (size_t i = 0; i < t.data[0].size(); ++i) {
      ASSERT_EQ(std::memcmp(&t.data[0][i], &original[0][i], sizeof(float)), 0) << "input changed at " << i;
    }
    EXPECT_EQ(StateBytes(psgd), before);
  });
}

// A float32 matrix is scanned inside the first P product when that P rides in the cross-rank
// check (small P), and by a scan of its own otherwise (P over the eager limit): both find a
// NaN or Inf anywhere, after a clean step has filled the error memory.
TEST(PowerSGDNonFiniteTest, FoundWhetherTheFirstPRidesInTheCheckOrNot) {
  RunRanks(3, LaunchMode::kThreads, [](Communicator& comm) {
    // 8192 x 8 at rank 2: P is 64 KiB, over the 64 KiB - 40 bytes an eager message may carry on 3 ranks.
    for (std::vector<int64_t> shape : {std::vector<int64_t>{12, 10}, std::vector<int64_t>{8192, 8}}) {
      const std::string where = std::to_string(shape[0]) + "x" + std::to_string(shape[1]);
      PowerSGD psgd(Compressing());
      psgd.AllReduce(comm, Tensors().With("w", shape, comm.rank(), 0).list());
      for (size_t pos : {size_t{0}, size_t(shape[0] * shape[1] / 2 + 1), size_t(shape[0] * shape[1] - 1)}) {
        const std::vector<uint8_t> before = StateBytes(psgd);
        Tensors t = Tensors().With("w", shape, comm.rank(), 1);
        if (comm.rank() == 2) t.data[0][pos] = pos == 0 ? std::numeric_limits<float>::quiet_NaN()
                                                        : -std::numeric_limits<float>::infinity();
        const PowerSGDStats st = psgd.AllReduce(comm, t.list());
        EXPECT_EQ(st.nonfinite_calls, 1u) << where << " at " << pos;
        EXPECT_EQ(st.compressed_tensors, 0u) << where;
        EXPECT_EQ(StateBytes(psgd), before) << where;
      }
    }
  });
}

TEST(PowerSGDNonFiniteTest, HalfPrecisionInfIsDetected) {
  RunRanks(2, LaunchMode::kThreads, [](Communicator& comm) {
    PowerSGD psgd(Compressing());
    for (DType d : {DType::kFloat16, DType::kBFloat16}) {
      TypedArray a(d, 64);
      for (size_t i = 0; i < 64; ++i) a.set(i, comm.rank() + 1);
      if (comm.rank() == 0) a.set(3, std::numeric_limits<double>::infinity());
      std::vector<GradientTensor> list = {{std::string("h") + DTypeName(d), a.buffer(), {8, 8}}};
      const PowerSGDStats s = psgd.AllReduce(comm, list);
      EXPECT_EQ(s.nonfinite_calls, 1u) << DTypeName(d);
      EXPECT_TRUE(std::isinf(a.get(3)));
      EXPECT_EQ(a.get(0), 1.5);
    }
  });
}

// ---- checkpoints ----

class PowerSGDCheckpointTest : public ::testing::TestWithParam<LaunchMode> {};

TEST_P(PowerSGDCheckpointTest, SaveAndRestoreResumesBitIdentically) {
  RunRanks(3, GetParam(), [](Communicator& comm) {
    PowerSGDOptions o;
    o.matrix_approximation_rank = 2;
    o.start_powerSGD_iter = 1;
    auto step = [&](PowerSGD& p, int s) {
      Tensors t = Tensors().With("conv", {8, 2, 3, 3}, comm.rank(), s).With("fc", {10, 20}, comm.rank(), s).With("bias", {10}, comm.rank(), s);
      p.AllReduce(comm, t.list());
      return t.data;
    };
    PowerSGD psgd(o);
    for (int s = 0; s < 3; ++s) step(psgd, s);
    const std::string bytes = psgd.SaveState().Serialize();
    std::vector<std::vector<std::vector<float>>> a, b;
    for (int s = 3; s < 5; ++s) a.push_back(step(psgd, s));
    PowerSGD restored(o);
    const PowerSGDCheckpoint c = PowerSGDCheckpoint::Deserialize(bytes);
    EXPECT_EQ(c.Serialize(), bytes);
    ASSERT_EQ(c.tensors.size(), 3u);
    EXPECT_EQ(c.tensors.at("fc").steps, 3);
    EXPECT_EQ(c.tensors.at("fc").q.size(), 20u * 2);
    EXPECT_EQ(c.tensors.at("fc").error.size(), 200u);
    EXPECT_TRUE(c.tensors.at("bias").q.empty());
    restored.LoadState(c);
    for (int s = 3; s < 5; ++s) b.push_back(step(restored, s));
    EXPECT_EQ(a, b) << "a restored object must continue exactly as the original";
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, PowerSGDCheckpointTest, ::testing::ValuesIn(LaunchModes()),
                         [](const auto& info) { return LaunchModeName(info.param); });

TEST(PowerSGDCheckpointFormatTest, MalformedOrIncompatibleCheckpointsAreRejected) {
  PowerSGDCheckpoint c;
  c.options.matrix_approximation_rank = 2;
  c.tensors["w"].shape = {4, 6};
  c.tensors["w"].steps = 2;
  c.tensors["w"].q.assign(12, 0.5f);
  c.tensors["w"].error.assign(24, 0.25f);
  const std::string bytes = c.Serialize();
  for (size_t cut : {size_t{0}, size_t{5}, size_t{20}, bytes.size() - 1}) {
    EXPECT_THROW(PowerSGDCheckpoint::Deserialize(bytes.substr(0, cut)), InvalidArgumentError) << cut;
  }
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { PowerSGDCheckpoint::Deserialize("XXXXXXXXXXXX"); }), "magic");
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { PowerSGDCheckpoint::Deserialize(bytes + "x"); }), "trailing bytes");
  PowerSGDOptions o;
  o.matrix_approximation_rank = 1;
  PowerSGD rank1(o);
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { rank1.LoadState(c); }), "the checkpoint has rank 2, this object rank 1");
  o.matrix_approximation_rank = 2;
  PowerSGD rank2(o);
  PowerSGDCheckpoint bad = c;
  bad.tensors["w"].q.resize(10);
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { rank2.LoadState(bad); }), "Q has 10 elements, 6 x 2 expected");
  bad = c;
  bad.tensors["w"].error.resize(3);
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { rank2.LoadState(bad); }), "error memory has 3 elements");
  rank2.LoadState(c);
  PowerSGDTensorState st;
  ASSERT_TRUE(rank2.GetTensorState("w", &st));
  EXPECT_EQ(st.q, c.tensors["w"].q);
  EXPECT_EQ(st.steps, 2);
}

// A checkpoint (e.g. from PowerSGD.load_state_dict) whose shape's element count overflows 64
// bits: [3, 6148914691236517206] wraps to 2 elements, which an unchecked product would match
// with a 2-float error memory. Refused with the key and shape, through Deserialize too, and the
// object keeps its state.
TEST(PowerSGDCheckpointFormatTest, ShapesWhoseElementCountOverflowsAreRejected) {
  PowerSGDOptions o;
  o.matrix_approximation_rank = 2;
  PowerSGD psgd(o);
  PowerSGDCheckpoint good;
  good.options = o;
  good.tensors["kept"].shape = {4, 6};
  good.tensors["kept"].steps = 3;
  psgd.LoadState(good);

  PowerSGDCheckpoint bad;
  bad.options = o;
  bad.tensors["fc.weight"].shape = {3, 6148914691236517206};
  bad.tensors["fc.weight"].steps = 1;
  bad.tensors["fc.weight"].error = {1.0f, 2.0f};
  const std::string expected =
      "PowerSGD::LoadState: key \"fc.weight\": the element count of shape [3, 6148914691236517206] overflows int64";
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { psgd.LoadState(bad); }), expected);
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { psgd.LoadState(PowerSGDCheckpoint::Deserialize(bad.Serialize())); }),
                  expected);
  // Without arrays, and with more dimensions.
  bad.tensors["fc.weight"].error.clear();
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { psgd.LoadState(bad); }), expected);
  bad.tensors["fc.weight"].shape = {1 << 16, 1 << 16, 1 << 16, 1 << 16};
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { psgd.LoadState(bad); }),
                  "key \"fc.weight\": the element count of shape [65536, 65536, 65536, 65536] overflows int64");
  // Negative dimensions, also where the product is positive.
  bad.tensors["fc.weight"].shape = {-4, -6};
  bad.tensors["fc.weight"].error.assign(24, 0.0f);
  EXPECT_CONTAINS(Expect<InvalidArgumentError>([&] { psgd.LoadState(bad); }),
                  "PowerSGD::LoadState: key \"fc.weight\": shape [-4, -6] has a negative dimension");
  // The failed loads changed nothing.
  PowerSGDTensorState st;
  EXPECT_FALSE(psgd.GetTensorState("fc.weight", &st));
  ASSERT_TRUE(psgd.GetTensorState("kept", &st));
  EXPECT_EQ(st.steps, 3);
}

}  // namespace
}  // namespace testing
}  // namespace gossipcc
