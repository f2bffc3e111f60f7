// Quantized all-reduce: a lossy sum or average of float32 buffers that sends 8 or 4 bits per
// element (plus a float32 scale per block) instead of 32 (docs/comm.md, "Quantized all-reduce").
//
//   gossipcc::QuantizedAllreduceOptions o;
//   o.bits = 4;                                   // or 8
//   gossipcc::QuantizedAllreduce(*comm, gossipcc::CpuBuffer(x.data(), n), o);   // x <- ~average
//
// Algorithm (n ranks; the buffer in slices of kQuantizedSliceElements, whole blocks; in a slice of B
// blocks rank r owns the contiguous blocks [B*r/n, B*(r+1)/n)):
//  1. Check: every rank all-gathers a 64-byte header (dtype, count, bits, block size, op, device,
//     and whether its own arguments are valid); one eager exchange.
//  2. Quantize: each block of this rank's input becomes a float32 scale s = M / Q, M = max |x| of
//     the block, Q = 2^(bits-1) - 1 (127 or 7), and per element the symmetric signed integer
//     q = round(x / s) in [-Q, Q] (round to nearest, ties to even: see "Rounding"), 8 bits one per
//     byte, 4 bits two per byte (low nibble first).
//  3. Reduce-scatter, in n - 1 rounds per slice: in round r each rank sends its quantized copy of
//     rank (me + r)'s blocks to that rank and receives rank (me - r)'s copy of its own blocks (a
//     point-to-point batch). The owner dequantizes every rank's copy (s * q, float32) and adds them
//     in rank order in float32 (average: then divides by n).
//  4. The owner quantizes that sum again (same format) and every rank gets every owner's bytes:
//     for a buffer of more than kQuantizedEagerBytes quantized, in a ring all-gather (step
//     g = 1..n-1 of a slice: owner (me - g)'s quantized sum from the left neighbour, owner
//     (me - g + 1)'s to the right one, in pieces of about kQuantizedGatherPieceBytes, each
//     forwarded as soon as it is here); for a smaller one, in n - 1 rounds per slice (round r:
//     this rank's quantized sum to rank me + r, rank me - r's into its place). Every rank
//     dequantizes the same bytes: the result is bitwise identical on every rank (and a pure
//     function of every rank's input and state: neither the slicing, the ownership nor the
//     pieces change a block's arithmetic).
// The scatter rounds run one at a time, in the same order on every rank (per slice), then the
// gather: every round is a permutation and the ring sends to one neighbour only, so each host's
// link carries one stream each way. (A buffer of at most kQuantizedEagerBytes quantized, bound
// by latency, has every ready round in flight at once.) The CPU work runs while messages are on
// the wire: the input is quantized owner by owner in the order the rounds send it (the first
// round waits for one owner's region only), a slice's sum as soon as its scatter rounds are in,
// each piece dequantized as soon as it arrives. Messages use point-to-point tag
// kQuantizedAllreduceTag.
// Why a ring for the gather: in rounds, each round's peer is a new connection (idle since the
// previous call, so TCP restarts it from its initial window) and a round starts only once the
// previous one has landed on both sides; the ring keeps one connection busy and forwards piece
// by piece. On the emulated 100 Mbit/s hosts (4 ranks, 16 MB, 8 bits) the call took 588-612 ms
// against 614-640 ms in rounds (docs/benchmarks.md (f)).
// An earlier version ran one all-to-all-v and one all-gather-v per slice on the communicator's two
// lanes, so each host sent up to 2 (n - 1) streams at once; on the emulated 100 Mbit/s hosts (tbf,
// 4 ranks, 16 MB) that cost 6-31 retransmitted TCP segments per rank per call (the rounds: 0.1-2.5)
// and its all-to-all-v phase ran at 7-10 MB/s of a ~12 MB/s link.
// Per rank on the wire: 2 (n-1)/n of the quantized size, (bits/8 + 4/block_size) bytes per
// element: 1.016 (8 bits) or 0.516 (4 bits) bytes with the default block of 256, against 4
// bytes for the exact all-reduce's 2 (n-1)/n.
//
// Error bound (without error feedback). For an element of block b, with M_r = max |x| over block b
// of rank r's input and Q = 2^(bits-1) - 1, the result differs from the exact sum sum_r x_r by at
// most
//     E_sum = (1/Q + (n + 32) * 2^-24) * sum_r M_r  +  2^-96
// and from the exact average by at most E_avg = (1/Q + (n + 32) * 2^-24) * (sum_r M_r) / n + 2^-96.
// (Each quantization is off by at most half a step, M/(2Q), for the ranks' inputs and for the
// owner's sum, whose block maximum is at most sum_r M_r; the (n + 32) * 2^-24 term covers float32
// rounding of the scale, the products and the n - 1 additions; 2^-96 covers blocks whose maximum
// is below 2^-100, which are sent as zeros.) QuantizedAllreduceErrorBound computes it. Non-finite
// values: a block with a NaN or an infinity on any rank (or whose sum overflows float32) comes
// out as NaN in all of its elements, on every rank.
//
// Rounding: to nearest, not stochastic. It halves the worst-case error of stochastic rounding
// (M/(2Q) instead of M/Q per quantization) and is deterministic without a shared random stream,
// so results are reproducible and testable bit for bit; its bias (a value that sits between two
// levels call after call is rounded the same way every time) is what error feedback removes.
//
// Error feedback (QuantizedResidual, or QuantizedErrorFeedback for state kept per key): a rank
// adds the residual of its previous call to its input before quantizing and keeps
// (input + residual) - (what it sent) as the next residual; the owner of a block likewise adds its
// own residual to the block's sum before quantizing it again and keeps what it did not send.
// Then the running sum of the outputs over K calls differs from the running sum of the exact
// results by (average of the ranks' last residuals) + (the owners' last residuals), each at most
// about half a quantization step: a bound that does not grow with K (tested over 1000 calls).
//
// Errors: every rank raises the same error, before anything is modified (data or residuals):
//  - InvalidArgumentError when any rank's arguments are invalid (bits not 4 or 8, block_size
//    outside [1, kMaxQuantizedBlockSize], op other than sum or average, dtype other than float32,
//    a CUDA buffer, null data with elements, residual buffers of the wrong size or type), naming
//    each such rank and its problem;
//  - MismatchError when the ranks disagree on dtype, element count, bits, block size or op,
//    naming each rank's value;
//  - whatever the Communicator raises (TimeoutError, PeerError, AbortedError); after a transport
//    failure part-way the residuals are unchanged (written at the end) and data may hold the
//    result in some regions, its input in others.
// Synchronous: call it from one thread per communicator at a time (it issues an all-gather, then
// the point-to-point messages, and waits for all of them), in the same order with respect to other
// collectives on every rank, and with no point-to-point traffic of the caller's own on
// kQuantizedAllreduceTag meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/quantized_blocks.h"  // quantized_internal: the codec, for tests and benchmarks
#include "comm/types.h"

namespace gossipcc {

inline constexpr size_t kDefaultQuantizedBlockSize = 256;
inline constexpr size_t kMaxQuantizedBlockSize = size_t{1} << 20;
// The buffer goes through the algorithm in slices of this many elements (rounded down to whole
// blocks, at least one; 16 MB of float32): the sum of one slice overlaps the rounds of the next.
inline constexpr size_t kQuantizedSliceElements = size_t{1} << 22;
// A buffer whose quantized size is at most this many bytes has all its ready rounds in flight at
// once, its gather in rounds too (latency-bound); a larger one, one round at a time, and its
// gather in a ring.
inline constexpr size_t kQuantizedEagerBytes = size_t{64} << 10;
// The ring gather's messages: an owner's region in pieces of about this many bytes (whole
// blocks), so that a rank forwards a piece while the next one still arrives; and how many
// of its receives, and of its sends, it keeps posted at once (a bound on the threads and on
// the time a posted message waits: each has the communicator's timeout from its posting).
inline constexpr size_t kQuantizedGatherPieceBytes = size_t{256} << 10;
inline constexpr size_t kQuantizedGatherInFlight = 8;
// The point-to-point tag of the rounds ("QAR"), in the range the torch backend reserves for
// gossipcc's own messages (ProcessGroupGossipcc::kReservedTagBegin/End).
inline constexpr uint32_t kQuantizedAllreduceTag = 0x51415200;

struct QuantizedAllreduceOptions {
  int bits = 8;                                 // 4 or 8
  size_t block_size = kDefaultQuantizedBlockSize;  // elements per block (one scale each)
  ReduceOp op = ReduceOp::kAvg;                 // kSum or kAvg
};

// Error-feedback state of one buffer: two float32 CPU buffers of data.count elements each,
// updated in place (start them at zero). `sent`: what this rank's input lost to quantization
// (every element). `owned`: what this rank's owned blocks of the sum lost to the owner's
// quantization (elements outside this rank's blocks are neither read nor written). Both empty
// (count 0, data null): no error feedback.
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
// group and QuantizedErrorFeedback do). A fresh allocation faults its pages in on every call:
// on the emulated 100 Mbit/s hosts (4 ranks, 16 MB, 8 bits) that took 4-12 ms before the first
// round, unevenly across ranks, and a round waits for its slowest sender. It grows to the
// largest call's needs (about twice the quantized size, plus 4 bytes per element this rank
// owns in a slice) and never shrinks. One call at a time per scratch. A call that fails
// part-way hands the buffers messages were posted on to the communicator
// (Communicator::KeepUntilClosed: a receive may still be posted on them) and the next call
// allocates anew.
struct QuantizedAllreduceScratch {
  // Internal to QuantizedAllreduce.
  std::vector<uint8_t> quantized;              // this rank's quantized input, then the result
  std::vector<std::vector<uint8_t>> received;  // per slice: every rank's copy of this rank's region
  std::vector<float> sum;                      // the owner's float32 sum of a slice's region
};

// In place: data <- (approximately) the sum or average of every rank's data; see above.
// `scratch`: memory kept between calls (null: this call allocates its own).
QuantizedAllreduceStats QuantizedAllreduce(Communicator& comm, Buffer data, const QuantizedAllreduceOptions& options,
                                           QuantizedResidual residual = {},
                                           QuantizedAllreduceScratch* scratch = nullptr);

// The per-element bound above (E_sum or E_avg by `op`), for an element whose block has
// sum over ranks of block maxima `sum_of_block_maxima`.
double QuantizedAllreduceErrorBound(int bits, int ranks, double sum_of_block_maxima, ReduceOp op);

// Bytes of `count` elements quantized in blocks of `block_size` (scales included).
size_t QuantizedBytes(size_t count, int bits, size_t block_size);

// The elements rank `rank` of `ranks` owns (sums and quantizes again): per slice, a range of
// whole blocks; ascending [begin, end) ranges, empty ones left out.
std::vector<std::pair<size_t, size_t>> QuantizedOwnedRanges(size_t count, size_t block_size, int rank, int ranks);

// Error feedback kept per key (e.g. a parameter's or fragment's name): AllReduce adds the key's
// residuals and keeps the new ones. A key's state starts at zero, and starts again at zero when
// its element count changes (every rank must make the same calls, so they reset alike).
// Not thread-safe.
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


}  // namespace gossipcc
