// PowerSGD compressed all-reduce (Vogels et al., NeurIPS 2019) as a collective over a
// Communicator: averages a list of gradient tensors across ranks, sending two low-rank factors
// per matrix instead of the matrix. See docs/powersgd.md.
//
//   gossipcc::compression::PowerSGD psgd(ParsePowerSGDOptions("rank=2,start_iter=10"));
//   std::vector<GradientTensor> grads = {{"layer1.weight", CpuBuffer(w, 64 * 27), {64, 3, 3, 3}},
//                                        {"layer1.bias", CpuBuffer(b, 64), {64}}};
//   psgd.AllReduce(*comm, grads);   // in place: each buffer now holds the (approximate) average
//
// Per call: tensors with one dimension, too small to be worth compressing, or whose key has
// had fewer than start_iter calls are averaged exactly, in one packed all-reduce per dtype.
// The rest (viewed as shape[0] x numel/shape[0]) go through PowerSGD: their P factors in one
// packed float32 all-reduce, their Q factors in another (per power iteration).
//
// AllReduce reads as the paper's algorithm, one call per step; each step's contract is in
// power_sgd_steps.h, the cross-rank check's in power_sgd_check.h.
//
// Not thread-safe: one thread per PowerSGD object, and (as for every collective) the same
// sequence of calls with the same keys and shapes on every rank.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/types/span.h"
#include "comm/communicator.h"
#include "comm/types.h"
#include "compression/power_sgd_options.h"

namespace gossipcc {
namespace compression {

namespace internal {
class MathBackend;
class PackCache;
struct KeyState;
}  // namespace internal

// One tensor to average: a view of its memory (updated in place) plus its shape and a key
// that identifies it stably across steps (e.g. the parameter's name). Float dtypes only
// (float32, float64, float16, bfloat16); all tensors of one call on the same device.
struct GradientTensor {
  std::string key;
  Buffer data;
  std::vector<int64_t> shape;
};

// A flat buffer (e.g. one of DDP's flattened buckets) with a stable key.
struct FlatGradient {
  std::string key;
  Buffer data;
};

// Sizes of one call (or, summed, of every call so far).
struct PowerSGDStats {
  uint64_t calls = 0;
  uint64_t tensors = 0;
  uint64_t compressed_tensors = 0;
  uint64_t elements_before = 0;  // elements of the tensors
  uint64_t elements_after = 0;   // elements handed to the comm layer (exact + P + Q)
  uint64_t bytes_before = 0;     // bytes of the tensors, in their dtypes
  uint64_t bytes_after = 0;      // bytes of exact data, P and Q handed to the comm layer (P, Q: float32)
  // The cross-rank consistency check: an allgather of 40 bytes a call, plus padding to 8 bytes
  // when a small exact part (within the eager limit) travels in it instead of in an all-reduce.
  uint64_t check_bytes = 0;
  uint64_t allreduce_calls = 0;  // data all-reduces issued (the exact part's, unless it rode with the check)
  uint64_t nonfinite_calls = 0;  // calls that met NaN/Inf (pass-through: averaged exactly)

  double compression_ratio() const {  // elements before / elements after (PyTorch's measure)
    return elements_after == 0 ? 1.0 : static_cast<double>(elements_before) / elements_after;
  }
  void Add(const PowerSGDStats& o);
  std::string ToString() const;
};

// The state of one tensor key, as saved in checkpoints. `error` (n*m floats, row-major) and
// `q` (m*r floats, row-major) are empty until the key's first compressed step (error also
// stays empty without error feedback).
struct PowerSGDTensorState {
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  int64_t steps = 0;  // calls that included this key (exact or compressed)
  std::vector<float> error;
  std::vector<float> q;
};

struct PowerSGDCheckpoint {
  PowerSGDOptions options;
  std::map<std::string, PowerSGDTensorState> tensors;

  // A self-describing little-endian byte string ("GSPSGD01" ...) and back. Deserialize
  // throws InvalidArgumentError on anything malformed or truncated.
  std::string Serialize() const;
  static PowerSGDCheckpoint Deserialize(const std::string& bytes);
};

class PowerSGD {
 public:
  // Validates the options (InvalidArgumentError).
  explicit PowerSGD(PowerSGDOptions options = {});
  ~PowerSGD();
  PowerSGD(const PowerSGD&) = delete;
  PowerSGD& operator=(const PowerSGD&) = delete;

  // Averages `tensors` across the ranks of `comm` in place and returns this call's stats.
  // Synchronous. Errors:
  //  - InvalidArgumentError (this rank, before any communication): bad shape/count (also a
  //    negative dimension or an element count that overflows int64), empty or duplicate key,
  //    non-float dtype, mixed devices, null data.
  //  - MismatchError (every rank, before any payload moves): ranks passed different keys,
  //    shapes, dtypes, options or per-key step counts (a fingerprint of all of them is
  //    compared), naming each rank's tensor count, element count and fingerprint.
  //  - InvalidArgumentError on every rank for NaN/Inf when options.nonfinite == kError.
  //  - Whatever the Communicator raises (TimeoutError, PeerError, AbortedError).
  // On an error no state changes; after a transport failure mid-call the tensors are undefined.
  PowerSGDStats AllReduce(Communicator& comm, absl::Span<const GradientTensor> tensors);

  // For callers that only have flat buffers (a c10d ProcessGroup sees DDP's flattened
  // buckets, which as 1-D tensors would all be averaged exactly): each buffer of `count`
  // elements is compressed as a side x side matrix, side = ceil(sqrt(count)), zero-padded, as
  // PyTorch's batched_powerSGD_hook does; buffers whose square would never be worth
  // compressing stay 1-D (exact, unpadded). Costs a copy into and out of a padded scratch
  // (none when count is a perfect square). Keys and state as in AllReduce (shape {side, side}).
  PowerSGDStats AllReduceFlat(Communicator& comm, absl::Span<const FlatGradient> buffers);
  // The square shape AllReduceFlat uses for `count` elements. InvalidArgumentError when the
  // square's element count would overflow int64 (count > 3037000499^2); AllReduceFlat checks
  // each buffer first and names its key.
  static std::vector<int64_t> FlatMatrixShape(size_t count);

  const PowerSGDOptions& options() const { return options_; }
  const PowerSGDStats& last_stats() const { return last_; }
  const PowerSGDStats& total_stats() const { return total_; }

  // State of every key seen (copied to host memory for CUDA tensors).
  PowerSGDCheckpoint SaveState() const;
  // Replaces every key's state. The checkpoint's options must match this object's in rank and
  // error feedback, each shape must have no negative dimension and an element count within
  // int64, and each state's sizes must fit its shape (else InvalidArgumentError, naming the key
  // and the shape; the state is then unchanged).
  void LoadState(const PowerSGDCheckpoint& checkpoint);
  // One key's state (host copy); nullopt-like: returns false if the key is unknown.
  bool GetTensorState(const std::string& key, PowerSGDTensorState* out) const;

  // The Q (m x r, row-major) a key starts from: standard normal draws from a generator seeded
  // with random_seed and the key (and `step`, only without warm start), then orthonormalised.
  // A pure function: identical on every rank without communication.
  static std::vector<float> InitialQ(const PowerSGDOptions& options, const std::string& key, int64_t m, int r,
                                     int64_t step);

  // Would a tensor of this shape be compressed (once past start_iter)? And its rank min(n,m,r).
  // InvalidArgumentError for a negative dimension or an element count that overflows int64.
  static bool ShouldCompress(const std::vector<int64_t>& shape, const PowerSGDOptions& options, int* rank_used = nullptr);

 private:
  internal::MathBackend& BackendFor(Device device);

  PowerSGDOptions options_;
  std::map<std::string, std::unique_ptr<internal::KeyState>> states_;  // by key
  std::unique_ptr<internal::PackCache> packs_;  // P, Q and exact packs, kept between calls
  std::unique_ptr<internal::MathBackend> cpu_;
  std::map<int, std::unique_ptr<internal::MathBackend>> cuda_;
  PowerSGDStats last_, total_;
};

}  // namespace compression
}  // namespace gossipcc
