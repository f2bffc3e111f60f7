// PowerSGD compressed all-reduce (Vogels et al., NeurIPS 2019) over a Communicator: averages
// gradient tensors, sending two low-rank factors per matrix (docs/powersgd.md). Tensors that do
// not pay are averaged exactly. AllReduce reads as the paper's algorithm, one call per step
// (power_sgd_steps.h; the cross-rank check: power_sgd_check.h). Not thread-safe; every rank makes
// the same calls with the same keys and shapes.
//
//   gossipcc::compression::PowerSGD psgd(ParsePowerSGDOptions("rank=2,start_iter=10"));
//   std::vector<GradientTensor> grads = {{"layer1.weight", CpuBuffer(w, 64 * 27), {64, 3, 3, 3}},
//                                        {"layer1.bias", CpuBuffer(b, 64), {64}}};
//   psgd.AllReduce(*comm, grads);   // in place: each buffer now holds the (approximate) average
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/types/span.h"
#include "comm/communicator.h"
#include "comm/core/types.h"
#include "compression/power_sgd_options.h"

namespace gossipcc {
namespace compression {

namespace internal {
class MathBackend;
class PackCache;
struct KeyState;
}  // namespace internal

// One tensor: its memory (updated in place), shape and stable key (e.g. the parameter's name);
// a float dtype; all tensors of a call on one device.
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
  // The cross-rank check's bytes (40 a call, plus padding when data rides in it).
  uint64_t check_bytes = 0;
  uint64_t allreduce_calls = 0;  // data all-reduces issued (the exact part's, unless it rode with the check)
  uint64_t nonfinite_calls = 0;  // calls that met NaN/Inf (pass-through: averaged exactly)

  double compression_ratio() const {  // elements before / elements after (PyTorch's measure)
    return elements_after == 0 ? 1.0 : static_cast<double>(elements_before) / elements_after;
  }
  void Add(const PowerSGDStats& o);
  std::string ToString() const;
};

// One key's state as checkpoints hold it; `error` (n*m) and `q` (m*r) empty until its first
// compressed step (error: always without error feedback).
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

  // A little-endian byte string ("GSPSGD01" ...) and back (InvalidArgumentError if malformed).
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

  // Averages `tensors` in place, synchronously. InvalidArgumentError on this rank for bad
  // tensors; MismatchError on every rank when ranks disagree (keys, shapes, dtypes, options,
  // step counts); the comm layer's errors. No state changes on an error (docs/powersgd.md).
  PowerSGDStats AllReduce(Communicator& comm, absl::Span<const GradientTensor> tensors);

  // For flat buffers (DDP's buckets): each compressed as a zero-padded side x side matrix,
  // side = ceil(sqrt(count)), as batched_powerSGD_hook does; one never worth it stays exact.
  PowerSGDStats AllReduceFlat(Communicator& comm, absl::Span<const FlatGradient> buffers);
  // AllReduceFlat's square shape for `count`; InvalidArgumentError if it overflows int64.
  static std::vector<int64_t> FlatMatrixShape(size_t count);

  const PowerSGDOptions& options() const { return options_; }
  const PowerSGDStats& last_stats() const { return last_; }
  const PowerSGDStats& total_stats() const { return total_; }

  // State of every key seen (copied to host memory for CUDA tensors).
  PowerSGDCheckpoint SaveState() const;
  // Replaces every key's state; InvalidArgumentError naming the key (state unchanged) if the
  // rank or error feedback differ or a shape or size does not fit.
  void LoadState(const PowerSGDCheckpoint& checkpoint);
  // One key's state (host copy); nullopt-like: returns false if the key is unknown.
  bool GetTensorState(const std::string& key, PowerSGDTensorState* out) const;

  // A key's initial Q (m x r): seeded normal draws, orthonormalised; the same on every rank.
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
