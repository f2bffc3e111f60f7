// CrossRankCheck: PowerSGD's agreement across ranks (not in the paper), one all-gather before
// any payload moves. Each rank sends a fingerprint of what it was asked (keys, order, shapes,
// dtypes, per-key step counts, what is compressed), a hash of its options, its tensor and
// element counts, and how many of its tensors hold NaN/Inf. Every rank then raises the same
// MismatchError naming each rank's values when they differ, and sees the same NaN/Inf verdict.
//
// On the CPU, when the message stays within the eager limit (EagerCollectiveMaxBytes), data
// rides in the same all-gather and every rank reduces the gathered copies itself, in rank
// order (an eager all-reduce sends its payload to every peer too, so this costs no bytes, only
// saves exchanges):
//  - the exact part (one dtype), instead of its own all-reduce (ReduceGatheredExact);
//  - the first power iteration's P = M Q, computed before the check from the gradient and the
//    error memory without writing either (nothing may change before the check passes), instead
//    of the first P all-reduce (SumGatheredP). A call then takes 2 exchanges (check + exact + P,
//    then Q), not 4.
//
// Use: construct, ScanNonFinite, ComputeFirstP when carries_first_p(), Exchange, Verify.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/communicator.h"
#include "compression/power_sgd_steps.h"

namespace gossipcc {
namespace compression {
namespace internal {

class CrossRankCheck {
 public:
  // Decides what rides along: never on CUDA, a single rank, or an exact part of several dtypes.
  CrossRankCheck(int ranks, Device device, absl::Span<const GradientTensor> tensors, const Selection& selection);

  bool carries_exact() const { return exact_bytes_ > 0; }
  bool carries_first_p() const { return first_p_; }

  // Finds the tensors holding NaN/Inf (unless options.nonfinite is kUnchecked): one pass per
  // tensor, except float32 matrices whose first P is computed for the check, which
  // ComputeFirstP scans in its own pass.
  void ScanNonFinite(MathBackend& backend, const PowerSGDOptions& options);
  // P = M Q of the first iteration into this rank's message, on the CPU (`cpu`; states an
  // earlier call left on a GPU move there). Writes neither the gradient nor the error memory;
  // non-float32 matrices are loaded into their scratch (M = grad + error), kept for the
  // steps that follow.
  void ComputeFirstP(MathBackend& cpu, KeyStates& states, InitialQs& initial_q, const PowerSGDOptions& options,
                     Selection& selection);
  // The all-gather. When ranks sent messages of different sizes (their tensor lists differ),
  // the communicator raised MismatchError on every rank alike and exchanged nothing: every rank
  // then runs the bare check, which names what differs (or, if nothing does, goes on with
  // nothing riding along).
  void Exchange(Communicator& comm, const PowerSGDOptions& options);
  // Throws MismatchError (options or tensor lists differ) or, for NaN/Inf under kError,
  // InvalidArgumentError, the same on every rank. Returns whether any rank met NaN/Inf (the
  // call is then averaged exactly, state untouched). Counts the check's bytes into `stats`.
  bool Verify(const std::string& where, const PowerSGDOptions& options, PowerSGDStats& stats) const;

  // The gathered messages, for ReduceGatheredExact and SumGatheredP.
  const uint8_t* table() const { return reinterpret_cast<const uint8_t*>(table_.data()); }
  size_t stride() const { return table_.size() / ranks_ * sizeof(int64_t); }
  static constexpr size_t kExactOffset = 5 * sizeof(int64_t);  // after the check's fields
  size_t first_p_offset() const { return p_offset_bytes_; }

 private:
  enum Field { kFingerprint, kOptions, kTensors, kElements, kNonFinite, kNumFields };
  static_assert(kExactOffset == kNumFields * sizeof(int64_t), "the exact part follows the fields");
  int64_t field(int rank, Field f) const { return table_[rank * (table_.size() / ranks_) + f]; }

  const int ranks_;
  absl::Span<const GradientTensor> tensors_;
  const Selection& selection_;
  size_t exact_bytes_ = 0;  // exact bytes carried; 0: the exact part is reduced apart
  bool first_p_ = false;    // the first P is carried
  size_t p_offset_bytes_ = 0;
  std::vector<char> nonfinite_;  // per tensor
  std::vector<int64_t> mine_, table_;
};

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
