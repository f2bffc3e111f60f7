// Long runs that check conservation and memory: push-sum rounds and PowerSGD steps on N ranks
// (threads of this process, Gloo over loopback), used by the `soak` binary (full length,
// prints the figures) and by `soak_test` (shortened, asserts the bounds).
#pragma once

#include <cstdint>
#include <string>

namespace gossipcc {
namespace soak {

struct PushSumSoak {
  int ranks = 8;
  int64_t rounds = 10000;
  size_t elements = 4096;  // float64 per rank
  std::string graph = "exponential";
  // Results (rank 0's view; the sums are all-reduced).
  double x_drift = 0;       // max over elements |sum x(end) - sum x(0)| / |sum x(0)|
  double w_drift = 0;       // |sum w(end) - n| / n
  double consensus = 0;     // max over ranks and elements |x/w - average| / |average|
  double rss_start_mb = 0;  // after the first 100 rounds (buffers and connections warm)
  double rss_end_mb = 0;
  double seconds = 0;
};
void Run(PushSumSoak& s);

// PowerSGD with error feedback keeps  sum_t out(t) + mean_i e_i(T) = sum_t mean_i g_i(t)
// (out: the averaged approximation every rank gets; e: each rank's error memory).
struct PowerSGDSoak {
  int ranks = 8;
  int64_t steps = 2000;
  int rows = 128, cols = 128, rank = 2;
  double identity_error = 0;  // max |lhs - rhs| / max |rhs|
  double rss_start_mb = 0;    // after the first 50 steps
  double rss_end_mb = 0;
  double seconds = 0;
};
void Run(PowerSGDSoak& s);

// VmRSS of this process in MiB.
double RssMb();

}  // namespace soak
}  // namespace gossipcc
