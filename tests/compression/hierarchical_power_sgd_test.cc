// HierarchicalPowerSGDAllReduce (compression/hierarchical_power_sgd.h) on H x G layouts, against
// PowerSGD over the H hosts computed here in double precision from the paper's steps
// (reference.h's ReferenceStep on the host means, with error feedback per host and warm start),
// over three calls, the first exact; every rank of every host with the same bits; the deal of
// keys to local ranks; an error in one local rank's step across hosts fails every rank with the
// tensors unchanged.
#include "compression/hierarchical_power_sgd.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/core/errors.h"
#include "comm/host_groups.h"
#include "gtest/gtest.h"
#include "tests/comm/harness.h"
#include "tests/compression/reference.h"

namespace gossipcc {
namespace testing {
namespace {

using compression::GradientTensor;
using compression::PowerSGD;
using compression::PowerSGDOptions;

constexpr uint64_t kSeed = 17;
constexpr int kCalls = 3;

using Layout = HostLayout;

const std::vector<TensorSpec>& Specs() {
  static const std::vector<TensorSpec> specs = {
      {"w1", {32, 48}}, {"w2", {40, 20}}, {"conv", {16, 16, 3}}, {"b1", {48}}, {"w4", {24, 24}}};
  return specs;
}

PowerSGDOptions Options() {
  PowerSGDOptions o;
  o.matrix_approximation_rank = 2;
  o.start_powerSGD_iter = 1;  // call 0 exact, then compressed
  return o;
}

float Grad(int rank, int call, const std::string& key, size_t i) {
  return static_cast<float>(GradValue(kSeed, rank, call, key, i));
}

class HierarchicalPowerSGDTest : public ::testing::TestWithParam<Layout> {};

TEST_P(HierarchicalPowerSGDTest, EqualsPowerSGDOverTheHostMeans) {
  const Layout layout = GetParam();
  const int n = layout.size();
  if (!InSanitizerRankCounts(std::min(n, 8))) GTEST_SKIP() << "n = " << n << " runs under the other sanitizer";
  const PowerSGDOptions o = Options();

  std::mutex mu;
  // got[call][rank][key]
  std::vector<std::vector<std::map<std::string, std::vector<float>>>> got(
      kCalls, std::vector<std::map<std::string, std::vector<float>>>(n));
  RunRanksWithStore(n, LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store);
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    PowerSGD across(o);
    for (int call = 0; call < kCalls; ++call) {
      std::map<std::string, std::vector<float>> data;
      std::vector<GradientTensor> tensors;
      for (const TensorSpec& s : Specs()) {
        std::vector<float>& v = data[s.key];
        v.resize(static_cast<size_t>(Numel(s.shape)));
        for (size_t i = 0; i < v.size(); ++i) v[i] = Grad(rank, call, s.key, i);
      }
      for (const TensorSpec& s : Specs()) tensors.push_back({s.key, CpuBuffer(data[s.key].data(), data[s.key].size()), s.shape});
      compression::HierarchicalPowerSGDAllReduce(across, groups, tensors);
      std::lock_guard<std::mutex> lock(mu);
      got[call][rank] = std::move(data);
    }
  });

  // The reference over H nodes, node h's gradient the mean of its ranks'.
  std::map<std::string, std::vector<Mat>> errors;
  std::map<std::string, Mat> qs;
  for (int call = 0; call < kCalls; ++call) {
    for (const TensorSpec& s : Specs()) {
      const int64_t count = Numel(s.shape);
      const int64_t rows = s.shape[0], cols = count / rows;
      std::vector<Mat> ms(layout.hosts, Mat(rows, cols));
      for (int h = 0; h < layout.hosts; ++h) {
        for (int64_t k = 0; k < count; ++k) {
          double sum = 0;
          for (int l = 0; l < layout.per_host; ++l) sum += Grad(h * layout.per_host + l, call, s.key, k);
          ms[h].v[k] = sum / layout.per_host;
        }
      }
      std::vector<double> want(count, 0.0);
      const bool compressed = call >= o.start_powerSGD_iter && PowerSGD::ShouldCompress(s.shape, o);
      if (!compressed) {
        for (int h = 0; h < layout.hosts; ++h) {
          for (int64_t k = 0; k < count; ++k) want[k] += ms[h].v[k] / layout.hosts;
        }
      } else {
        std::vector<Mat>& err = errors[s.key];
        if (err.empty()) err.assign(layout.hosts, Mat(rows, cols));
        for (int h = 0; h < layout.hosts; ++h) {
          for (int64_t k = 0; k < count; ++k) ms[h].v[k] += err[h].v[k];
        }
        const int r = std::min<int>({o.matrix_approximation_rank, static_cast<int>(rows), static_cast<int>(cols)});
        if (!qs.count(s.key)) {
          const std::vector<float> q0 = PowerSGD::InitialQ(o, s.key, cols, r, 0);
          qs[s.key] = Mat(cols, r);
          for (size_t k = 0; k < q0.size(); ++k) qs[s.key].v[k] = q0[k];
        }
        const Mat out = ReferenceStep(ms, qs[s.key], 1, o.use_error_feedback);
        err = ms;  // ReferenceStep left the new errors in ms
        for (int64_t k = 0; k < count; ++k) want[k] = out.v[k];
      }
      double scale = 0;
      for (double w : want) scale = std::max(scale, std::fabs(w));
      for (int rank = 0; rank < n; ++rank) {
        const std::vector<float>& g = got[call][rank][s.key];
        for (int64_t k = 0; k < count; ++k) {
          if (std::fabs(g[k] - want[k]) > 1e-3 * scale + 1e-6) {
            FAIL() << "call " << call << ", rank " << rank << ", " << s.key << "[" << k << "]: " << g[k] << ", want "
                   << want[k] << (compressed ? " (compressed)" : " (exact)");
          }
        }
        // Bitwise the same everywhere (each tensor made once per host, the same across hosts).
        EXPECT_EQ(std::memcmp(g.data(), got[call][0][s.key].data(), g.size() * sizeof(float)), 0)
            << "call " << call << ", rank " << rank << ", " << s.key;
      }
    }
  }
}

TEST(HierarchicalPowerSGDDealTest, EachKeyToOneLocalRankWhateverElseTheCallHolds) {
  // FNV-1a of the key mod G: fixed values (the same on every platform), every local rank used.
  std::vector<int> seen(4, 0);
  for (int k = 0; k < 64; ++k) {
    const int r = compression::LocalRankOfKey(absl::StrCat("layer", k, ".weight"), 4);
    ASSERT_GE(r, 0);
    ASSERT_LT(r, 4);
    ++seen[r];
  }
  for (int r = 0; r < 4; ++r) EXPECT_GT(seen[r], 4) << "local rank " << r;
  EXPECT_EQ(compression::LocalRankOfKey("w", 1), 0);
  EXPECT_EQ(compression::LocalRankOfKey("a", 2), static_cast<int>(((1469598103934665603ull ^ 'a') * 1099511628211ull) % 2));
}

// One host's ranks disagree with the others on a tensor's shape: the local rank that runs it
// fails PowerSGD's check across hosts (MismatchError), every other rank of every host fails too,
// and every rank's tensors are as they were.
TEST(HierarchicalPowerSGDErrorsTest, AMismatchAcrossHostsFailsEveryRankWithTensorsUnchanged) {
  const Layout layout{2, 2};
  std::mutex mu;
  std::vector<std::string> errors(layout.size());
  RunRanksWithStore(layout.size(), LaunchMode::kThreads, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = CreateOnHosts(layout.hosts, layout.per_host, rank, store, std::chrono::seconds(10));
    HostGroups groups = HostGroups::Split(*comm, store, "groups");
    PowerSGDOptions o = Options();
    o.start_powerSGD_iter = 0;
    PowerSGD across(o);
    // Host 1 sees "w" as 20 x 30, host 0 as 30 x 20: the same count, another shape.
    const std::vector<int64_t> shape = rank < 2 ? std::vector<int64_t>{30, 20} : std::vector<int64_t>{20, 30};
    std::vector<float> w(600), b(40);
    for (size_t i = 0; i < w.size(); ++i) w[i] = Grad(rank, 0, "w", i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = Grad(rank, 0, "b", i);
    const std::vector<float> w0 = w, b0 = b;
    std::string error;
    try {
      compression::HierarchicalPowerSGDAllReduce(across, groups,
                                                 {{"w", CpuBuffer(w.data(), 600), shape}, {"b", CpuBuffer(b.data(), 40), {40}}});
    } catch (const CommError& e) {
      error = e.what();
    }
    EXPECT_EQ(w, w0) << "rank " << rank;
    EXPECT_EQ(b, b0) << "rank " << rank;
    std::lock_guard<std::mutex> lock(mu);
    errors[rank] = error;
  });
  // "w" and "b" go to the local ranks their keys hash to; a rank that ran neither, or only
  // "b", learns from the agreement that the one running "w" failed.
  const int w_rank = compression::LocalRankOfKey("w", 2);
  for (int r = 0; r < layout.size(); ++r) {
    EXPECT_FALSE(errors[r].empty()) << "rank " << r;
    if (r % 2 != w_rank) {
      EXPECT_NE(errors[r].find(absl::StrCat("local rank ", w_rank, " of this host failed")), std::string::npos)
          << errors[r];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalPowerSGDTest,
                         ::testing::Values(Layout{2, 2}, Layout{4, 2}, Layout{2, 3}, Layout{1, 4}, Layout{3, 1},
                                           Layout{1, 1}),
                         HostLayoutName);

}  // namespace
}  // namespace testing
}  // namespace gossipcc
