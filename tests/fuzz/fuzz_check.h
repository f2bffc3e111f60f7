// Shared by the fuzz targets in tests/fuzz/: a check that reports the input and aborts, so
// that libFuzzer (or the Bazel corpus replay test) records it as a finding.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "compression/power_sgd_options.h"

namespace gossipcc {
namespace fuzz {

[[noreturn]] inline void Finding(const std::string& input, const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n  input (%zu bytes): \"", what.c_str(), input.size());
  for (unsigned char c : input) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      std::fputc(c, stderr);
    } else {
      std::fprintf(stderr, "\\x%02x", c);
    }
  }
  std::fprintf(stderr, "\"\n");
  std::abort();
}

#define FUZZ_CHECK(input, cond, what)                                      \
  do {                                                                     \
    if (!(cond)) ::gossipcc::fuzz::Finding((input), std::string(what) + " [" #cond "]"); \
  } while (0)

// Bitwise for the doubles, so that -0.0 vs 0.0 or a lost digit counts as a difference (the
// cross-rank options hash in power_sgd.cc hashes the bytes).
inline bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

inline bool SameOptions(const compression::PowerSGDOptions& a, const compression::PowerSGDOptions& b) {
  return a.matrix_approximation_rank == b.matrix_approximation_rank &&
         a.start_powerSGD_iter == b.start_powerSGD_iter && SameBits(a.min_compression_rate, b.min_compression_rate) &&
         a.use_error_feedback == b.use_error_feedback && a.warm_start == b.warm_start &&
         SameBits(a.orthogonalization_epsilon, b.orthogonalization_epsilon) && a.random_seed == b.random_seed &&
         a.batch_tensors_with_same_shape == b.batch_tensors_with_same_shape &&
         a.num_iters_per_step == b.num_iters_per_step && a.nonfinite == b.nonfinite;
}

}  // namespace fuzz
}  // namespace gossipcc
