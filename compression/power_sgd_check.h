// CrossRankCheck: PowerSGD's agreement across ranks, one all-gather before any payload moves
// (docs/powersgd.md, "The algorithm, per call"): a fingerprint of keys, order, shapes, dtypes,
// step counts and decisions, an options hash, counts and NaN/Inf counts; every rank raises the
// same MismatchError when they differ. On the CPU, within the eager limit, the exact part and
// the first P ride along and every rank reduces the gathered copies in rank order.
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

  // Finds the tensors holding NaN/Inf (unless kUnchecked); ComputeFirstP scans its own.
  void ScanNonFinite(MathBackend& backend, const PowerSGDOptions& options);
  // The first P = M Q into this rank's message, on the CPU, writing neither gradient nor error.
  void ComputeFirstP(MathBackend& cpu, KeyStates& states, InitialQs& initial_q, const PowerSGDOptions& options,
                     Selection& selection);
  // The all-gather; if the ranks' message sizes differ, the bare check names what differs.
  void Exchange(Communicator& comm, const PowerSGDOptions& options);
  // MismatchError, or InvalidArgumentError for NaN/Inf under kError, alike on every rank;
  // returns whether any rank met NaN/Inf. Counts the check's bytes into `stats`.
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
