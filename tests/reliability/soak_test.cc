// Shortened soak (the full one: bazel run //tests/reliability:soak): push-sum conserves its
// sums to 1e-6 relative and PowerSGD keeps its error-feedback identity; memory does not grow.
#include "gtest/gtest.h"
#include "tests/reliability/soak.h"

namespace gossipcc {
namespace soak {
namespace {

// Generous: allocator noise, not leaks, can move RSS by a few MiB. Under ASan/TSan freed
// memory sits in the sanitizer's quarantine, so RSS grows by design (ASan's leak checker covers
// leaks there): no bound.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr double kRssGrowthMb = 1e9;
#else
constexpr double kRssGrowthMb = 32;
#endif

TEST(SoakTest, PushSumConservesAndStaysFlat) {
  PushSumSoak s;
  s.ranks = 4;
  s.rounds = 1500;
  soak::Run(s);
  EXPECT_LT(s.x_drift, 1e-6);
  EXPECT_LT(s.w_drift, 1e-6);
  EXPECT_LT(s.consensus, 1e-6);
  EXPECT_LT(s.rss_end_mb - s.rss_start_mb, kRssGrowthMb) << s.rss_start_mb << " -> " << s.rss_end_mb;
  std::printf("push-sum: drift x %.3g w %.3g, RSS %.1f -> %.1f MiB, %.1f s\n", s.x_drift, s.w_drift, s.rss_start_mb,
              s.rss_end_mb, s.seconds);
}

TEST(SoakTest, PowerSGDKeepsTheErrorFeedbackIdentityAndStaysFlat) {
  PowerSGDSoak s;
  s.ranks = 4;
  s.steps = 150;
  soak::Run(s);
  EXPECT_LT(s.identity_error, 1e-5);
  EXPECT_LT(s.rss_end_mb - s.rss_start_mb, kRssGrowthMb) << s.rss_start_mb << " -> " << s.rss_end_mb;
  std::printf("PowerSGD: identity error %.3g, RSS %.1f -> %.1f MiB, %.1f s\n", s.identity_error, s.rss_start_mb,
              s.rss_end_mb, s.seconds);
}

}  // namespace
}  // namespace soak
}  // namespace gossipcc
