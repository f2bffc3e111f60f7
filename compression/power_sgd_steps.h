// PowerSGD's steps, one function each, in the order PowerSGD::AllReduce calls them (Vogels et
// al., NeurIPS 2019, Algorithm 1 with error feedback; the cross-rank check is ours,
// power_sgd_check.h):
//
//   CheckTensors               local validation, before anything is sent
//   SelectTensorsToCompress    which tensors are compressed, which are averaged exactly
//   (CrossRankCheck)           every rank asked the same; NaN/Inf found (power_sgd_check.h)
//   CreateStates               each key's error memory and Q, once the call is known consistent
//   AllReduceExact             all-reduce the rest: the tensors not compressed, averaged
//   AddErrorFeedback           M = grad + error memory; the Q each matrix starts from
//   ComputeP                   P = M Q
//   AllReduceP                 P summed over ranks (or SumGatheredP: it came with the check)
//   Orthogonalize              P's columns orthonormal
//   ComputeQ                   Q = M^T P
//   AllReduceQ                 Q averaged over ranks
//   DecompressAndUpdateMemory  grad = P Q^T, error memory = M - P Q^T, Q kept for warm start
//   CountStep                  every key's step count + 1
//
// Internal to compression/. Matrices are row-major float32 in the backend's memory
// (power_sgd_math.h): M is n x m, P n x r, Q m x r. The P and Q of every compressed tensor of a
// call are packed in one buffer each, so that each all-reduce is one collective.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/types/span.h"
#include "comm/communicator.h"
#include "compression/power_sgd.h"
#include "compression/power_sgd_math.h"

namespace gossipcc {
namespace compression {
namespace internal {

// One key's state between calls.
struct KeyState {
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  int64_t steps = 0;
  MathBackend* backend = nullptr;  // where error and q live
  std::shared_ptr<void> error;     // n*m floats or null
  size_t error_count = 0;
  std::shared_ptr<void> q;  // m*r floats or null
  size_t q_count = 0;

  float* error_ptr() const { return static_cast<float*>(error.get()); }
  float* q_ptr() const { return static_cast<float*>(q.get()); }
  std::vector<float> Download(const std::shared_ptr<void>& a, size_t count) const;
  // Moves the arrays into `target`'s memory (same values).
  void MoveTo(MathBackend& target);
};
using KeyStates = std::map<std::string, std::unique_ptr<KeyState>>;

// Packed buffers kept between calls (grow-only), so that steady-state calls do not allocate:
// slot = the dtype for exact packs, kPSlot / kQSlot for the factors.
class PackCache {
 public:
  static constexpr int kPSlot = 100, kQSlot = 101;
  // At least `bytes` bytes in `backend`'s memory, not initialised.
  void* Get(MathBackend& backend, int slot, size_t bytes);

 private:
  struct Cached {
    std::shared_ptr<void> memory;
    size_t bytes = 0;
  };
  std::map<std::tuple<int, int, int>, Cached> packs_;
};

// One compressed tensor of a call: tensors[index] viewed as an n x m matrix, rank r.
struct Factorization {
  size_t index = 0;  // into the call's tensors
  int64_t n = 0, m = 0;
  int r = 0;
  size_t p_offset = 0, q_offset = 0;  // in floats, into the packed P and Q
  KeyState* state = nullptr;          // set by AddErrorFeedback
  float* M = nullptr;                 // set by AddErrorFeedback (or by the check's first P)
  // CPU float32 with error feedback: M is the gradient's memory and the error memory is added
  // to it by the first ComputeQ (one pass fewer over M). Until then M reads as grad + pending_error.
  const float* pending_error = nullptr;
  std::shared_ptr<void> scratch;  // M for gradients that are not float32 (or on CUDA)
};

struct Selection {
  std::vector<size_t> exact;                 // averaged exactly, in call order
  std::vector<Factorization> compressed;     // in call order
  uint64_t fingerprint = 0;  // keys, dtypes, shapes, step counts and choices: every rank must agree
  uint64_t total_elements = 0;
  size_t p_total = 0, q_total = 0;  // floats in the packed P and Q
};

// FNV-1a, the hash of the cross-rank check and of the initial Q's seed.
struct Hasher {
  uint64_t h = 0xcbf29ce484222325ull;
  void Bytes(const void* p, size_t n);
  template <typename T>
  void Pod(const T& v) { Bytes(&v, sizeof(v)); }
  void Str(const std::string& s);
};

std::string ShapeString(const std::vector<int64_t>& shape);
// Why `shape` is not a valid tensor shape, or "" when it is (then *numel is its element count):
// no negative dimension, and a product of the dimensions within int64 (checked multiplications:
// a wrapped product can equal a small buffer's count).
std::string ShapeProblem(const std::vector<int64_t>& shape, int64_t* numel);

// Throws InvalidArgumentError ("<where>: ...") unless every tensor has a non-empty unique key, a
// float dtype, a valid shape matching its count, data unless empty, the device of tensor 0, and
// the shape and dtype its key had before. Returns that device. Sends nothing.
Device CheckTensors(const std::string& where, absl::Span<const GradientTensor> tensors, const KeyStates& states);

// A tensor is compressed once its key has had start_powerSGD_iter calls and its shape is worth
// it (PowerSGD::ShouldCompress). Lays out the compressed tensors' P and Q in the packs, and
// counts the call's tensors and their sizes into `stats`.
Selection SelectTensorsToCompress(absl::Span<const GradientTensor> tensors, const KeyStates& states,
                                  const PowerSGDOptions& options, PowerSGDStats& stats);

// The Q each compressed tensor starts from when the key has none to warm-start from
// (PowerSGD::InitialQ), drawn at most once per call.
class InitialQs {
 public:
  InitialQs(const PowerSGDOptions& options, absl::Span<const GradientTensor> tensors, const Selection& selection,
            const KeyStates& states)
      : options_(options), tensors_(tensors), selection_(selection), states_(states),
        drawn_(selection.compressed.size()) {}
  const std::vector<float>& For(size_t j);  // selection.compressed[j]'s

 private:
  const PowerSGDOptions& options_;
  absl::Span<const GradientTensor> tensors_;
  const Selection& selection_;
  const KeyStates& states_;
  std::vector<std::vector<float>> drawn_;
};

// A state for every key not seen before, in `backend`'s memory.
void CreateStates(absl::Span<const GradientTensor> tensors, MathBackend& backend, KeyStates& states);

// Averages tensors[which] exactly: one packed all-reduce per dtype (a lone tensor in place).
void AllReduceExact(Communicator& comm, MathBackend& backend, PackCache& packs,
                    absl::Span<const GradientTensor> tensors, const std::vector<size_t>& which, PowerSGDStats& stats);
// The exact part when it came with the cross-rank check: rank r's copies of the `which` tensors,
// packed in that order at table + r * stride + offset, averaged in rank order into them.
void ReduceGatheredExact(absl::Span<const GradientTensor> tensors, const std::vector<size_t>& which,
                         const uint8_t* table, size_t stride, size_t offset, int ranks, PowerSGDStats& stats);

// Error feedback: every compressed tensor's M = grad + error memory (float32: the gradient's own
// memory, the error added by the first ComputeQ on the CPU; otherwise a scratch), its state on
// `backend`, its Q set to the initial one unless warm-started, its error memory allocated.
// Tensors whose M the check already loaded keep it.
void AddErrorFeedback(MathBackend& backend, absl::Span<const GradientTensor> tensors, Selection& selection,
                      KeyStates& states, InitialQs& initial_q, const PowerSGDOptions& options);

// P = M Q for every compressed tensor: Q is the state's on the first iteration, the packed Q of
// the previous one after. Reads M (+ pending error) without writing it.
void ComputeP(MathBackend& backend, const Selection& selection, int iteration, const float* Q, float* P);
// P summed over ranks (kSum: the orthogonalisation that follows makes the scale irrelevant).
void AllReduceP(Communicator& comm, MathBackend& backend, const Selection& selection, float* P, PowerSGDStats& stats);
// The first P when it came with the check: rank r's at table + r * stride, summed in rank order
// into P (CPU), as the all-reduce would have.
void SumGatheredP(const uint8_t* table, size_t stride, int ranks, const Selection& selection, float* P);
// Each P's columns orthonormal (power_sgd_math.h: Gram-Schmidt or Householder; eps guards zero
// columns).
void Orthogonalize(MathBackend& backend, const Selection& selection, float eps, float* P);
// Q = M^T P for every compressed tensor; adds a pending error memory into M in the same pass
// (M is grad + error from here on).
void ComputeQ(MathBackend& backend, Selection& selection, const float* P, float* Q);
// Q averaged over ranks. Counts the iteration's P and Q into `stats` (sent, or carried by the check).
void AllReduceQ(Communicator& comm, MathBackend& backend, const Selection& selection, float* Q, PowerSGDStats& stats);
// grad = P Q^T (rounded to the gradient's dtype) and, with error feedback, error = M - P Q^T, in
// one pass over M; Q saved in the state (the next call's warm start).
void DecompressAndUpdateMemory(MathBackend& backend, absl::Span<const GradientTensor> tensors,
                               const Selection& selection, const float* P, const float* Q,
                               const PowerSGDOptions& options);
void CountStep(absl::Span<const GradientTensor> tensors, KeyStates& states);

}  // namespace internal
}  // namespace compression
}  // namespace gossipcc
