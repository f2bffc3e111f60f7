// PowerSGD options: PyTorch's PowerSGDState names and defaults, plus power iterations per step,
// and a parser for "rank=2,start_iter=10,..." strings (GOSSIPCC_ALLREDUCE=powersgd:<options>).
#pragma once

#include <cstdint>
#include <string>

namespace gossipcc {
namespace compression {

// What to do when an input holds NaN or +-Inf on some rank. Every rank learns it during the
// cross-rank check, before any payload moves, so all ranks take the same branch.
enum class NonFinitePolicy : uint8_t {
  // Default. This call averages every tensor exactly (NaN/Inf flow through as in a plain
  // all-reduce, so e.g. an AMP grad scaler still sees them) and leaves the PowerSGD state
  // (error memory, Q, step counters) untouched.
  kPassThrough,
  // Every rank raises InvalidArgumentError naming the ranks and tensors; inputs and state are
  // left untouched.
  kError,
  // No scan (saves one pass over the inputs). NaN/Inf then enter P, Q and the error memory.
  kUnchecked,
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
  // PyTorch's name, kept so its options carry over; must stay false (Validate() rejects true
  // with kBatchSameShapeRejected). PyTorch stacks same-shape matrices into batched GEMMs to save
  // GPU kernel launches; it does not change the number of collectives, and neither would it
  // here: every call already sends all matrices' P factors in one all-reduce and all their Q
  // factors in another (docs/powersgd.md).
  bool batch_tensors_with_same_shape = false;
  // Power iterations per step; each one is a P all-reduce and a Q all-reduce.
  int num_iters_per_step = 1;
  NonFinitePolicy nonfinite = NonFinitePolicy::kPassThrough;

  // Throws InvalidArgumentError naming the option and the accepted range.
  void Validate() const;
  // "rank=1,start_iter=1000,min_compression_rate=2,...": parses back with ParsePowerSGDOptions.
  std::string ToString() const;
};

// Why batch_tensors_with_same_shape = true is rejected (the message of Validate() and of the
// parser for batch_same_shape=1).
extern const char* const kBatchSameShapeRejected;

// Parses comma-separated key=value pairs over the defaults; an empty string gives the
// defaults. Keys (PyTorch's long names are accepted too):
//   rank (matrix_approximation_rank), start_iter (start_powerSGD_iter), min_compression_rate,
//   error_feedback (use_error_feedback), warm_start, epsilon (orthogonalization_epsilon),
//   seed (random_seed), batch_same_shape (batch_tensors_with_same_shape; only 0: 1 is rejected),
//   iterations (num_iters_per_step), nonfinite (pass|error|unchecked).
// Keys and the words among the values (true, false, pass, ...) match whatever their case.
// Booleans: 0/1/true/false. Unknown keys, duplicates, malformed values and values outside the
// ranges Validate() checks raise InvalidArgumentError; the message lists the valid keys.
PowerSGDOptions ParsePowerSGDOptions(const std::string& text);

// The list of valid keys, as the parser's error messages print it.
std::string PowerSGDOptionKeys();

}  // namespace compression
}  // namespace gossipcc
