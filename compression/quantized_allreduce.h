// Quantized all-reduce: a lossy sum or average of float32 CPU buffers that sends 8 or 4 bits per
// element plus a float32 scale per block (format, algorithm, error bound: docs/comm.md,
// "Quantized all-reduce"; speed: docs/benchmarks.md#f-quantized-all-reduce-8-and-4-bits-vs-exact-float32).
//  - Bitwise the same result on every rank; without error feedback within
//    QuantizedAllreduceErrorBound of the exact one per element; a block with a NaN or an infinity
//    on any rank is NaN on every rank. Error feedback (QuantizedResidual, QuantizedErrorFeedback)
//    keeps the running sum of the outputs within about one quantization step of the exact one.
//  - Each block's owner (QuantizedOwnedRanges) sums it in float32 in rank order: a scatter in
//    n - 1 point-to-point rounds, then a ring all-gather of the re-quantized sums (rounds for at
//    most kQuantizedEagerBytes), on tag kQuantizedAllreduceTag.
//  - Errors are raised on every rank before anything is modified: InvalidArgumentError (a rank's
//    invalid arguments, named), MismatchError (ranks disagree on dtype, count, bits, block size or
//    op). After a transport failure part-way the residuals are unchanged, the data undefined.
//  - Synchronous: one call at a time per communicator, in the same collective order on every
//    rank, no other traffic on kQuantizedAllreduceTag meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/core/types.h"
#include "compression/quantized_blocks.h"  // quantized_internal: the codec, for tests and benchmarks

namespace gossipcc {

inline constexpr size_t kDefaultQuantizedBlockSize = 256;
inline constexpr size_t kMaxQuantizedBlockSize = size_t{1} << 20;
// Slice of the buffer (whole blocks): one slice's sum overlaps the next one's rounds.
inline constexpr size_t kQuantizedSliceElements = size_t{1} << 22;
// At most this many bytes quantized: every ready round in flight at once, the gather in rounds.
inline constexpr size_t kQuantizedEagerBytes = size_t{64} << 10;
// The ring gather forwards pieces of about this size, keeping this many receives and sends posted.
inline constexpr size_t kQuantizedGatherPieceBytes = size_t{256} << 10;
inline constexpr size_t kQuantizedGatherInFlight = 8;
// "QAR", in the tag range the torch backend reserves for gossipcc's own messages.
inline constexpr uint32_t kQuantizedAllreduceTag = 0x51415200;

struct QuantizedAllreduceOptions {
  int bits = 8;                                 // 4 or 8
  size_t block_size = kDefaultQuantizedBlockSize;  // elements per block (one scale each)
  ReduceOp op = ReduceOp::kAvg;                 // kSum or kAvg
};

// Error-feedback state of one buffer, updated in place (start at zero; both empty: none): `sent`,
// what this rank's input lost to quantization; `owned`, what its owned blocks of the sum lost.
// Two float32 CPU buffers of data.count elements.
struct QuantizedResidual {
  Buffer sent{nullptr, 0, DType::kFloat32, Device::CPU()};
  Buffer owned{nullptr, 0, DType::kFloat32, Device::CPU()};
  bool enabled() const { return sent.data != nullptr || owned.data != nullptr || sent.count || owned.count; }
};

struct QuantizedAllreduceStats {
  size_t quantized_bytes = 0;  // the whole buffer quantized (scales + codes)
  size_t bytes_sent = 0;       // payload bytes this rank sent (both phases, header excluded)
};

// Working memory of QuantizedAllreduce that a caller may keep between calls (the process
// group and QuantizedErrorFeedback do), so that no call faults fresh pages in before its first
// round. It grows to the largest call's needs and never shrinks; one call at a time per scratch.
// A call that fails part-way hands its posted buffers to Communicator::KeepUntilClosed.
struct QuantizedAllreduceScratch {
  // Internal to QuantizedAllreduce.
  std::vector<uint8_t> quantized;              // this rank's quantized input, then the result
  std::vector<std::vector<uint8_t>> received;  // per slice: every rank's copy of this rank's region
  std::vector<float> sum;                      // the owner's float32 sum of a slice's region
  // Internal to HierarchicalQuantizedAllreduce: the buffer in G slices, this rank's slice.
  std::vector<float> host_value, host_slice;
};

// In place: data <- (approximately) the sum or average of every rank's data.
// `scratch`: memory kept between calls (null: this call allocates its own).
QuantizedAllreduceStats QuantizedAllreduce(Communicator& comm, Buffer data, const QuantizedAllreduceOptions& options,
                                           QuantizedResidual residual = {},
                                           QuantizedAllreduceScratch* scratch = nullptr);

// The per-element error bound without error feedback (docs/comm.md), for an element whose block
// has sum over ranks of block maxima `sum_of_block_maxima`: of the sum, or the average by `op`.
double QuantizedAllreduceErrorBound(int bits, int ranks, double sum_of_block_maxima, ReduceOp op);

// Bytes of `count` elements quantized in blocks of `block_size` (scales included).
size_t QuantizedBytes(size_t count, int bits, size_t block_size);

// The elements rank `rank` of `ranks` owns (sums and quantizes again): per slice, a range of
// whole blocks; ascending [begin, end) ranges, empty ones left out.
std::vector<std::pair<size_t, size_t>> QuantizedOwnedRanges(size_t count, size_t block_size, int rank, int ranks);

// Error feedback kept per key (a parameter's or fragment's name); a key's state starts at zero,
// and again when its element count changes. Not thread-safe.
class QuantizedErrorFeedback {
 public:
  explicit QuantizedErrorFeedback(QuantizedAllreduceOptions options = {});
  QuantizedAllreduceStats AllReduce(Communicator& comm, const std::string& key, Buffer data);

  struct State {
    std::vector<float> sent, owned;
  };
  // nullptr for a key never seen.
  const State* state(const std::string& key) const;
  void set_state(const std::string& key, State state);  // sizes must match (InvalidArgumentError)
  void Reset() { states_.clear(); }
  const QuantizedAllreduceOptions& options() const { return options_; }

 private:
  QuantizedAllreduceOptions options_;
  std::map<std::string, State> states_;
  QuantizedAllreduceScratch scratch_;
};

// QuantizedAllreduce after its check (compression/quantized_check.h), for a two-level form
// (compression/hierarchical_quantized_allreduce.h) that runs the check on groups of its own:
// every rank of `comm` passed JudgeHeaders on equal arguments.
namespace quantized_internal {

QuantizedAllreduceStats QuantizedAllreduceChecked(Communicator& comm, Buffer data,
                                                  const QuantizedAllreduceOptions& options, QuantizedResidual residual,
                                                  QuantizedAllreduceScratch* scratch);

}  // namespace quantized_internal
}  // namespace gossipcc
