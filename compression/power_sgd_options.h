// PowerSGD options: PyTorch's PowerSGDState names and defaults, plus power iterations per step,
// and a parser for "rank=2,start_iter=10,..." strings (GOSSIPCC_ALLREDUCE=powersgd:<options>).
#pragma once

#include <cstdint>
#include <string>

namespace gossipcc {
namespace compression {

// NaN or +-Inf in some rank's input, known to every rank from the cross-rank check.
enum class NonFinitePolicy : uint8_t {
  kPassThrough,  // default: this call averages exactly, the PowerSGD state untouched
  kError,        // InvalidArgumentError on every rank; inputs and state untouched
  kUnchecked,    // no scan: NaN/Inf enter P, Q and the error memory
};
const char* NonFinitePolicyName(NonFinitePolicy policy);

struct PowerSGDOptions {
  // r: the rank of the approximation (per matrix, min(n, m, r) is used).
  int matrix_approximation_rank = 1;
  // Calls (per tensor key) that use an exact all-reduce before PowerSGD starts.
  int64_t start_powerSGD_iter = 1000;
  // A matrix n x m is compressed only if (n + m) * r * min_compression_rate < n * m.
  double min_compression_rate = 2;
  bool use_error_feedback = true;
  // Keep Q from the previous step (else a fresh random Q every step).
  bool warm_start = true;
  // Gram-Schmidt divides each column by (norm + epsilon).
  double orthogonalization_epsilon = 0;
  // Seeds the initial Q of each tensor (mixed with the tensor's key; identical on every rank).
  uint64_t random_seed = 0;
  // PyTorch's name, kept so its options carry over; must stay false (kBatchSameShapeRejected).
  bool batch_tensors_with_same_shape = false;
  // Power iterations per step; each one is a P all-reduce and a Q all-reduce.
  int num_iters_per_step = 1;
  NonFinitePolicy nonfinite = NonFinitePolicy::kPassThrough;

  // Throws InvalidArgumentError naming the option and the accepted range.
  void Validate() const;
  // "rank=1,start_iter=1000,min_compression_rate=2,...": parses back with ParsePowerSGDOptions.
  std::string ToString() const;
};

// Why batch_tensors_with_same_shape = true is rejected (Validate's and the parser's message).
extern const char* const kBatchSameShapeRejected;

// Parses comma-separated key=value pairs over the defaults (keys and aliases: docs/powersgd.md,
// "Options"; case-insensitive). Bad input raises InvalidArgumentError listing the valid keys.
PowerSGDOptions ParsePowerSGDOptions(const std::string& text);

// The list of valid keys, as the parser's error messages print it.
std::string PowerSGDOptionKeys();

}  // namespace compression
}  // namespace gossipcc
