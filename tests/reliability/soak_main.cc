// bazel run //tests/reliability:soak -- [push_sum_rounds=10000] [ranks=8] [powersgd_steps=2000]
// Prints the conservation drift and the process RSS at start and end of each run.
#include <cstdio>
#include <cstdlib>

#include "tests/reliability/soak.h"

int main(int argc, char** argv) {
  using namespace gossipcc::soak;
  PushSumSoak ps;
  PowerSGDSoak pw;
  if (argc > 1) ps.rounds = std::atoll(argv[1]);
  if (argc > 2) ps.ranks = pw.ranks = std::atoi(argv[2]);
  if (argc > 3) pw.steps = std::atoll(argv[3]);
  std::printf("push-sum soak: %d ranks (threads, Gloo over loopback), %s graph, %lld rounds, %zu float64 per rank\n",
              ps.ranks, ps.graph.c_str(), static_cast<long long>(ps.rounds), ps.elements);
  Run(ps);
  std::printf("  sum x relative drift   %.3g\n  sum w relative drift   %.3g\n  max |x/w - avg| / avg  %.3g\n"
              "  RSS after 100 rounds   %.1f MiB\n  RSS at the end         %.1f MiB\n  wall time              %.1f s\n",
              ps.x_drift, ps.w_drift, ps.consensus, ps.rss_start_mb, ps.rss_end_mb, ps.seconds);
  std::printf("PowerSGD soak: %d ranks, %lld steps, %dx%d float32 gradient, rank %d, error feedback\n", pw.ranks,
              static_cast<long long>(pw.steps), pw.rows, pw.cols, pw.rank);
  Run(pw);
  std::printf("  |sum out + mean e - sum mean g| / max|sum mean g|  %.3g\n  RSS after 50 steps     %.1f MiB\n"
              "  RSS at the end         %.1f MiB\n  wall time              %.1f s\n",
              pw.identity_error, pw.rss_start_mb, pw.rss_end_mb, pw.seconds);
  const bool ok = ps.x_drift < 1e-6 && ps.w_drift < 1e-6;
  std::printf("%s\n", ok ? "OK: push-sum drift < 1e-6" : "FAIL: push-sum drift >= 1e-6");
  return ok ? 0 : 1;
}
