#include "comm/quantized_allreduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <sstream>
#include <utility>

#include "comm/errors.h"
#include "comm/quantized_blocks.h"

namespace gossipcc {
namespace {

// The block format (comm/quantized_blocks.h).
using quantized_internal::LevelsOf;
using quantized_internal::BlockCount;
using quantized_internal::BlockOffset;
using quantized_internal::EncodedBytes;
using quantized_internal::DequantizeRange;
using quantized_internal::QuantizeRange;

size_t FirstBlockOf(size_t blocks, int rank, int ranks) {
  return static_cast<size_t>((static_cast<unsigned __int128>(blocks) * static_cast<unsigned>(rank)) /
                             static_cast<unsigned>(ranks));
}

// The header every rank all-gathers before anything moves.
enum Field { kMagic, kDType, kCount, kBits, kBlock, kOp, kDevice, kProblem, kFields };
constexpr int64_t kHeaderMagic = 0x51415231;  // "QAR1"

enum Problem : int64_t {
  kOk = 0,
  kBadBits,
  kBadBlock,
  kBadOp,
  kBadDType,
  kNotCpu,
  kNullData,
  kBadResidual,
};

std::string ProblemText(const int64_t* h) {
  switch (h[kProblem]) {
    case kBadBits:
      return "bits must be 4 or 8, got " + std::to_string(h[kBits]);
    case kBadBlock:
      return "block_size must be in [1, " + std::to_string(kMaxQuantizedBlockSize) + "], got " +
             std::to_string(h[kBlock]);
    case kBadOp:
      return std::string("op must be sum or avg, got ") + ReduceOpName(static_cast<ReduceOp>(h[kOp]));
    case kBadDType:
      return std::string("only float32 is supported, got ") + DTypeName(static_cast<DType>(h[kDType])) +
             " (convert to float32 first)";
    case kNotCpu:
      return "only CPU buffers are supported, got a CUDA buffer";
    case kNullData:
      return "data is null with " + std::to_string(h[kCount]) + " elements";
    case kBadResidual:
      return "the error-feedback residuals must both be float32 CPU buffers of the data's " +
             std::to_string(h[kCount]) + " elements (or both empty)";
    default:
      return "problem " + std::to_string(h[kProblem]);
  }
}

std::string FieldValue(Field f, int64_t v) {
  switch (f) {
    case kDType:
      return v >= 0 && v < kNumDTypes ? DTypeName(static_cast<DType>(v)) : std::to_string(v);
    case kOp:
      return v >= 0 && v < kNumReduceOps ? ReduceOpName(static_cast<ReduceOp>(v))
                                                                      : std::to_string(v);
    case kDevice:
      return v == 0 ? "cpu" : "cuda";
    default:
      return std::to_string(v);
  }
}

// A slice of the buffer: blocks [b0, b1) and, per rank r, the blocks it owns in it, as
// elements [elem[r], elem[r+1]) and quantized bytes [byte[r], byte[r+1]).
struct Slice {
  std::vector<size_t> elem, byte, range_bytes;
  uint8_t* received = nullptr;  // n copies of this rank's region (scratch.received)
  std::vector<float> new_owned;
};

size_t SliceBlocks(size_t block_size) { return std::max<size_t>(1, kQuantizedSliceElements / block_size); }
constexpr uint32_t kTag = kQuantizedAllreduceTag;

std::vector<Slice> PlanSlices(size_t count, size_t block, int bits, int n) {
  const size_t blocks = BlockCount(count, block);
  const size_t per_slice = SliceBlocks(block);
  std::vector<Slice> slices;
  for (size_t b0 = 0; b0 < blocks; b0 += per_slice) {
    const size_t b1 = std::min(blocks, b0 + per_slice);
    Slice sl;
    sl.elem.resize(n + 1);
    sl.byte.resize(n + 1);
    sl.range_bytes.resize(n);
    for (int r = 0; r <= n; ++r) {
      const size_t b = b0 + FirstBlockOf(b1 - b0, r, n);
      sl.elem[r] = std::min(count, b * block);
      sl.byte[r] = BlockOffset(b, count, bits, block);
    }
    for (int r = 0; r < n; ++r) sl.range_bytes[r] = sl.byte[r + 1] - sl.byte[r];
    slices.push_back(std::move(sl));
  }
  return slices;
}

// A part of owner o's region of a slice that the ring all-gather moves as one message: whole
// blocks, bytes [byte0, byte1) of the encoding, elements [elem0, elem1).
struct Piece {
  size_t byte0, byte1, elem0, elem1;
};

// Owner o's region of slice `sl` in pieces of about kQuantizedGatherPieceBytes. Every rank cuts
// a region alike, so a piece received is forwarded as the same piece.
std::vector<Piece> PiecesOf(const Slice& sl, int o, size_t count, int bits, size_t block) {
  std::vector<Piece> out;
  const size_t e0 = sl.elem[o], e1 = sl.elem[o + 1];
  if (e1 == e0) return out;
  const size_t b0 = e0 / block, b1 = (e1 + block - 1) / block, blocks = b1 - b0;
  const size_t k = std::clamp<size_t>(
      (sl.range_bytes[o] + kQuantizedGatherPieceBytes - 1) / kQuantizedGatherPieceBytes, 1, blocks);
  for (size_t j = 0; j < k; ++j) {
    const size_t p0 = b0 + blocks * j / k, p1 = b0 + blocks * (j + 1) / k;
    out.push_back({BlockOffset(p0, count, bits, block), BlockOffset(p1, count, bits, block), p0 * block,
                   std::min(count, p1 * block)});
  }
  return out;
}

// Phase 4 for a buffer of more than kQuantizedEagerBytes quantized: a ring all-gather of the
// owners' quantized sums (in `quantized`), each piece dequantized into x once it is here. At
// step g = 1..n-1 of a slice a rank receives owner (me - g)'s pieces from its left neighbour and
// sends owner (me - g + 1)'s to its right one: its own at step 1, then each piece it received at
// step g - 1 as soon as that piece is here. Both ends number the messages alike (slice, step,
// piece) and post them in that order, as the point-to-point layer matches them in order.
// Precondition: every scatter round is done and this rank's own sums are quantized.
void RingGather(Communicator& comm, const std::vector<Slice>& slices, int me, int n, int bits, size_t block,
                size_t count, uint8_t* quantized, float* x, QuantizedAllreduceStats& stats) {
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  std::vector<Piece> receives, sends;
  std::vector<size_t> forwards;  // per send: the receive whose piece it forwards, or kOwn
  constexpr size_t kOwn = std::numeric_limits<size_t>::max();
  for (size_t s = 0; s < slices.size(); ++s) {
    size_t previous_step = kOwn;  // the index of step g - 1's first receive
    for (int g = 1; g < n; ++g) {
      const std::vector<Piece> out = PiecesOf(slices[s], (me - g + 1 + n) % n, count, bits, block);
      for (size_t j = 0; j < out.size(); ++j) {
        sends.push_back(out[j]);
        forwards.push_back(g == 1 ? kOwn : previous_step + j);
      }
      previous_step = receives.size();
      for (const Piece& p : PiecesOf(slices[s], (me - g + n) % n, count, bits, block)) receives.push_back(p);
    }
  }

  // Every message comes from the left neighbour (one stream on this host's downlink), so
  // receives are posted a few ahead; sends are posted in order, each once its piece is here,
  // a few at a time. No deadlock: a send waits only for an earlier message from the left
  // neighbour, and the right one keeps its receives posted in the same order.
  std::deque<std::shared_ptr<Work>> posted_receives, posted_sends;
  size_t arrived = 0, next_receive = 0, next_send = 0;
  auto post_ready_sends = [&] {
    for (; next_send < sends.size() && posted_sends.size() < kQuantizedGatherInFlight &&
           (forwards[next_send] == kOwn || forwards[next_send] < arrived);
         ++next_send) {
      const Piece& p = sends[next_send];
      stats.bytes_sent += p.byte1 - p.byte0;
      posted_sends.push_back(
          comm.p2p({P2POp::Send(CpuBuffer(quantized + p.byte0, p.byte1 - p.byte0), right, kTag)}));
    }
  };
  auto decode = [&](const Piece& p) {
    DequantizeRange(quantized + p.byte0, p.elem1 - p.elem0, bits, block, x + p.elem0, /*add=*/false);
  };
  try {
    post_ready_sends();
    // This rank's own sums, while its first pieces are on the wire.
    for (const Slice& sl : slices) {
      for (const Piece& p : PiecesOf(sl, me, count, bits, block)) decode(p);
    }
    while (arrived < receives.size()) {
      for (; next_receive < receives.size() && next_receive < arrived + kQuantizedGatherInFlight; ++next_receive) {
        const Piece& p = receives[next_receive];
        posted_receives.push_back(
            comm.p2p({P2POp::Recv(CpuBuffer(quantized + p.byte0, p.byte1 - p.byte0), left, kTag)}));
      }
      posted_receives.front()->wait();
      posted_receives.pop_front();
      ++arrived;
      post_ready_sends();
      decode(receives[arrived - 1]);
      while (!posted_sends.empty() && posted_sends.front()->is_completed()) {
        posted_sends.front()->wait();  // (rethrows a failed send)
        posted_sends.pop_front();
      }
      post_ready_sends();
    }
    // The sends left (all of them are ready now that every piece is here).
    while (!posted_sends.empty()) {
      posted_sends.front()->wait();
      posted_sends.pop_front();
      post_ready_sends();
    }
  } catch (...) {
    // Every posted message is waited for before the caller's buffers go.
    for (auto* queue : {&posted_receives, &posted_sends}) {
      for (auto& w : *queue) {
        try {
          w->wait();
        } catch (...) {
        }
      }
    }
    throw;
  }
}

// After a failure part-way: the buffers messages were posted on (a receive may still be
// posted on them) go to the communicator, which frees them once its connections are gone;
// the scratch starts again empty.
void KeepPostedBuffers(Communicator& comm, QuantizedAllreduceScratch& scratch) {
  auto kept = std::make_shared<std::pair<std::vector<uint8_t>, std::vector<std::vector<uint8_t>>>>(
      std::move(scratch.quantized), std::move(scratch.received));
  comm.KeepUntilClosed(std::move(kept));
  scratch.quantized = {};
  scratch.received = {};
}

}  // namespace

size_t QuantizedBytes(size_t count, int bits, size_t block_size) {
  return EncodedBytes(count, bits, block_size);
}

std::vector<std::pair<size_t, size_t>> QuantizedOwnedRanges(size_t count, size_t block_size, int rank, int ranks) {
  std::vector<std::pair<size_t, size_t>> out;
  if (block_size < 1 || ranks < 1 || rank < 0 || rank >= ranks) return out;
  for (const Slice& sl : PlanSlices(count, block_size, 8, ranks)) {
    if (sl.elem[rank + 1] > sl.elem[rank]) out.emplace_back(sl.elem[rank], sl.elem[rank + 1]);
  }
  return out;
}

double QuantizedAllreduceErrorBound(int bits, int ranks, double sum_of_block_maxima, ReduceOp op) {
  const double relative = 1.0 / LevelsOf(bits) + (ranks + 32) * std::ldexp(1.0, -24);
  const double scaled = relative * sum_of_block_maxima;
  return (op == ReduceOp::kAvg ? scaled / ranks : scaled) + std::ldexp(1.0, -96);
}

namespace quantized_internal {

std::vector<int64_t> CheckHeader(Buffer data, const QuantizedAllreduceOptions& options,
                                 const QuantizedResidual& residual) {
  std::vector<int64_t> mine = {kHeaderMagic,
                               static_cast<int64_t>(data.dtype),
                               static_cast<int64_t>(data.count),
                               options.bits,
                               static_cast<int64_t>(options.block_size),
                               static_cast<int64_t>(options.op),
                               data.device.is_cuda() ? 1 : 0,
                               kOk};
  const bool feedback = residual.enabled();
  auto residual_ok = [&](const Buffer& b) {
    return b.data != nullptr && b.count == data.count && b.dtype == DType::kFloat32 && !b.device.is_cuda();
  };
  if (options.bits != 4 && options.bits != 8) {
    mine[kProblem] = kBadBits;
  } else if (options.block_size < 1 || options.block_size > kMaxQuantizedBlockSize) {
    mine[kProblem] = kBadBlock;
  } else if (options.op != ReduceOp::kSum && options.op != ReduceOp::kAvg) {
    mine[kProblem] = kBadOp;
  } else if (data.dtype != DType::kFloat32) {
    mine[kProblem] = kBadDType;
  } else if (data.device.is_cuda()) {
    mine[kProblem] = kNotCpu;
  } else if (data.data == nullptr && data.count > 0) {
    mine[kProblem] = kNullData;
  } else if (feedback && data.count > 0 && !(residual_ok(residual.sent) && residual_ok(residual.owned))) {
    mine[kProblem] = kBadResidual;
  }
  return mine;
}

void JudgeHeaders(const std::vector<int64_t>& table, int me, Buffer data, const QuantizedAllreduceOptions& options) {
  const int n = static_cast<int>(table.size() / kFields);
  auto header = [&](int r) { return table.data() + static_cast<size_t>(r) * kFields; };
  std::ostringstream where;
  where << "gossipcc quantized_allreduce (" << data.count << " x " << DTypeName(data.dtype) << ", " << options.bits
        << " bits, block " << options.block_size << ", " << ReduceOpName(options.op) << ") on rank " << me << " of "
        << n;
  std::string invalid;
  for (int r = 0; r < n; ++r) {
    if (header(r)[kMagic] != kHeaderMagic) {
      throw MismatchError(where.str() + ": rank " + std::to_string(r) +
                          " called another collective (its header is not a quantized all-reduce's)");
    }
    if (header(r)[kProblem] != kOk) {
      invalid += (invalid.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + ProblemText(header(r));
    }
  }
  std::string mismatch;
  const std::pair<Field, const char*> compared[] = {
      {kDType, "dtype"}, {kCount, "element count"}, {kBits, "bits"}, {kBlock, "block size"}, {kOp, "op"},
      {kDevice, "device"}};
  for (const auto& [field, name] : compared) {
    bool differ = false;
    for (int r = 1; r < n; ++r) differ |= header(r)[field] != header(0)[field];
    if (!differ) continue;
    mismatch += (mismatch.empty() ? "" : "; ") + std::string("ranks disagree on the ") + name + ": ";
    for (int r = 0; r < n; ++r) mismatch += (r ? ", rank " : "rank ") + std::to_string(r) + ": " + FieldValue(field, header(r)[field]);
  }
  if (!invalid.empty()) {
    throw InvalidArgumentError(where.str() + ": invalid arguments: " + invalid + (mismatch.empty() ? "" : "; " + mismatch) +
                               "; nothing was modified");
  }
  if (!mismatch.empty()) throw MismatchError(where.str() + ": " + mismatch + "; nothing was modified");
}

}  // namespace quantized_internal

QuantizedAllreduceStats QuantizedAllreduce(Communicator& comm, Buffer data, const QuantizedAllreduceOptions& options,
                                           QuantizedResidual residual, QuantizedAllreduceScratch* kept_scratch) {
  // 1. The check: every rank's header (with its own verdict on its arguments) to every rank.
  std::vector<int64_t> mine = quantized_internal::CheckHeader(data, options, residual);
  std::vector<int64_t> table(mine.size() * static_cast<size_t>(comm.size()));
  comm.allgather(CpuBuffer(mine.data(), mine.size()), CpuBuffer(table.data(), table.size()))->wait();
  quantized_internal::JudgeHeaders(table, comm.rank(), data, options);
  return quantized_internal::QuantizedAllreduceChecked(comm, data, options, residual, kept_scratch);
}

namespace quantized_internal {

QuantizedAllreduceStats QuantizedAllreduceChecked(Communicator& comm, Buffer data,
                                                  const QuantizedAllreduceOptions& options, QuantizedResidual residual,
                                                  QuantizedAllreduceScratch* kept_scratch) {
  const int n = comm.size();
  const int me = comm.rank();
  const bool feedback = residual.enabled();
  QuantizedAllreduceStats stats;
  const size_t count = data.count;
  if (count == 0) return stats;
  const int bits = options.bits;
  const size_t block = options.block_size;
  stats.quantized_bytes = QuantizedBytes(count, bits, block);
  auto* x = static_cast<float*>(data.data);
  float* sent_residual = feedback ? static_cast<float*>(residual.sent.data) : nullptr;
  float* owned_residual = feedback ? static_cast<float*>(residual.owned.data) : nullptr;

  std::vector<Slice> slices = PlanSlices(count, block, bits, n);
  const size_t num_slices = slices.size();
  QuantizedAllreduceScratch call_scratch;  // used when the caller keeps none
  QuantizedAllreduceScratch& scratch = kept_scratch ? *kept_scratch : call_scratch;
  auto at_least = [](auto& v, size_t k) {
    if (v.size() < k) v.resize(k);
  };
  // One buffer for both phases: this rank's quantized input, then, region by region as the
  // owners' sums arrive, the result (owner o's region of a slice is sent to o in the scatter
  // before o's sum overwrites it in the gather). Every byte of it that is read was written by
  // this call (the codec writes whole blocks, padding included), so a kept buffer's old
  // contents never matter.
  at_least(scratch.quantized, stats.quantized_bytes);
  uint8_t* const quantized = scratch.quantized.data();
  std::vector<float> new_sent(feedback ? count : 0);
  if (scratch.received.size() < num_slices) scratch.received.resize(num_slices);
  for (size_t s = 0; s < num_slices; ++s) {
    at_least(scratch.received[s], slices[s].range_bytes[me] * n);
    slices[s].received = scratch.received[s].data();
  }
  std::vector<float>& sum = scratch.sum;

  // The rounds, in this order on every rank: per slice the n - 1 scatter rounds, then (for a
  // buffer of at most kQuantizedEagerBytes quantized) per slice the n - 1 gather rounds; a
  // larger buffer gathers in a ring after them (RingGather). In round r a rank sends to rank + r
  // and receives from rank - r.
  struct Step {
    bool gather;
    size_t slice;
    int round;
  };
  const bool eager = stats.quantized_bytes <= kQuantizedEagerBytes;
  std::vector<Step> steps;
  for (int phase = 0; phase < (eager ? 2 : 1); ++phase) {
    for (size_t s = 0; s < num_slices; ++s) {
      for (int r = 1; r < n; ++r) steps.push_back({phase == 1, s, r});
    }
  }
  // What a slice's sum waits for: its n - 1 scatter rounds and this rank's own region quantized.
  std::vector<int> before_sum(num_slices, n);
  std::vector<char> summed(num_slices, 0);
  // Quantization in the order the rounds send it: per slice, owner rank + 1's region first (the
  // first round waits for that region only), this rank's own last.
  std::vector<std::pair<size_t, int>> units;
  for (size_t s = 0; s < num_slices; ++s) {
    for (int r = 1; r <= n; ++r) units.emplace_back(s, (me + r) % n);
  }
  std::vector<std::vector<char>> region_ready(num_slices, std::vector<char>(n, 0));
  size_t quantized_units = 0;

  auto quantize = [&](size_t s, int o) {
    Slice& sl = slices[s];
    const size_t e0 = sl.elem[o], e1 = sl.elem[o + 1];
    QuantizeRange(x + e0, sent_residual ? sent_residual + e0 : nullptr, feedback ? new_sent.data() + e0 : nullptr,
                  e1 - e0, bits, block, quantized + sl.byte[o]);
    if (o == me) {
      const size_t my_bytes = sl.range_bytes[me];
      if (my_bytes) {  // (an empty region: no pointer to copy from)
        std::memcpy(sl.received + static_cast<size_t>(me) * my_bytes, quantized + sl.byte[me], my_bytes);
      }
    }
    region_ready[s][o] = 1;
  };
  // Every rank's copy of this rank's blocks, dequantized and added in rank order in float32,
  // quantized again into this rank's region of `quantized`.
  auto reduce = [&](Slice& sl) {
    const size_t my_bytes = sl.range_bytes[me];
    const size_t my_begin = sl.elem[me], my_count = sl.elem[me + 1] - my_begin;
    at_least(sum, my_count);
    for (int r = 0; r < n; ++r) {
      DequantizeRange(sl.received + static_cast<size_t>(r) * my_bytes, my_count, bits, block, sum.data(),
                      /*add=*/r > 0);
    }
    if (options.op == ReduceOp::kAvg) {
      const float ranks = static_cast<float>(n);
      for (size_t i = 0; i < my_count; ++i) sum[i] /= ranks;
    }
    sl.new_owned.resize(feedback ? my_count : 0);
    QuantizeRange(sum.data(), feedback ? owned_residual + my_begin : nullptr, feedback ? sl.new_owned.data() : nullptr,
                  my_count, bits, block, quantized + sl.byte[me]);
  };
  // Every rank dequantizes the same bytes: owner o's region of a slice once o's sum is here.
  auto finish = [&](const Slice& sl, int o) {
    DequantizeRange(quantized + sl.byte[o], sl.elem[o + 1] - sl.elem[o], bits, block, x + sl.elem[o], /*add=*/false);
  };
  // Slices whose sum is quantized but not yet dequantized into this rank's own region (a
  // buffer that gathers in rounds; RingGather does its own): that waits until the first gather
  // round, which needs only the quantized sum, is on the wire.
  std::vector<size_t> own_region_pending;
  auto one_less_before_sum = [&](size_t s) {
    if (--before_sum[s] > 0) return;
    reduce(slices[s]);
    summed[s] = 1;
    if (eager) own_region_pending.push_back(s);  // (else RingGather dequantizes it)
  };
  auto ready = [&](const Step& st) {
    return st.gather ? summed[st.slice] != 0 : region_ready[st.slice][(me + st.round) % n] != 0;
  };
  // One round: a batch of this rank's send and receive (either may be empty: a rank owning no
  // block of a small slice).
  auto issue = [&](const Step& st) -> std::shared_ptr<Work> {
    Slice& sl = slices[st.slice];
    const int to = (me + st.round) % n, from = (me - st.round + n) % n;
    const size_t my_bytes = sl.range_bytes[me];
    std::vector<P2POp> ops;
    if (!st.gather) {
      // This rank's quantized copy of `to`'s blocks; `from`'s copy of this rank's blocks.
      if (sl.range_bytes[to]) {
        ops.push_back(P2POp::Send(CpuBuffer(quantized + sl.byte[to], sl.range_bytes[to]), to, kTag));
      }
      if (my_bytes) {
        ops.push_back(P2POp::Recv(CpuBuffer(sl.received + static_cast<size_t>(from) * my_bytes, my_bytes),
                                  from, kTag));
      }
    } else {
      // This rank's quantized sum; `from`'s sum, into its region.
      if (my_bytes) ops.push_back(P2POp::Send(CpuBuffer(quantized + sl.byte[me], my_bytes), to, kTag));
      if (sl.range_bytes[from]) {
        ops.push_back(P2POp::Recv(CpuBuffer(quantized + sl.byte[from], sl.range_bytes[from]), from, kTag));
      }
    }
    if (ops.empty()) return nullptr;
    if (ops[0].kind == P2POp::Kind::kSend) stats.bytes_sent += ops[0].buffer.count;
    return comm.p2p(ops);
  };

  // The CPU work (quantizing, summing, dequantizing) runs while a round is on the wire; a round
  // is issued as soon as the previous one is done and its data is ready.
  // Rounds in flight: one at a time (each host's link carries one stream each way), unless the
  // whole buffer quantized is at most kQuantizedEagerBytes: then the call is bound by latency,
  // not by the link, and every round that is ready goes at once.
  const size_t window = eager ? steps.size() : 1;
  size_t next = 0;
  std::deque<std::pair<std::shared_ptr<Work>, const Step*>> in_flight;  // issued, not waited for
  std::vector<const Step*> arrived;  // rounds waited for whose data is not yet used
  try {
    for (;;) {
      if (in_flight.size() < window && next < steps.size() && ready(steps[next])) {
        const Step* st = &steps[next++];
        in_flight.emplace_back(issue(*st), st);
        continue;
      }
      if (!own_region_pending.empty()) {
        finish(slices[own_region_pending.back()], me);
        own_region_pending.pop_back();
        continue;
      }
      if (!arrived.empty()) {
        const Step* st = arrived.back();
        arrived.pop_back();
        if (!st->gather) {
          one_less_before_sum(st->slice);
        } else {
          finish(slices[st->slice], (me - st->round + n) % n);
        }
        continue;
      }
      if (quantized_units < units.size()) {
        const auto [s, o] = units[quantized_units++];
        quantize(s, o);
        if (o == me) one_less_before_sum(s);
        continue;
      }
      if (in_flight.empty()) break;  // every round done and its data used
      auto [w, st] = std::move(in_flight.front());
      in_flight.pop_front();
      if (w) w->wait();
      arrived.push_back(st);
    }
    if (!eager) RingGather(comm, slices, me, n, bits, block, count, quantized, x, stats);
  } catch (...) {
    // Every posted message is waited for (RingGather waits for its own) before this frame's
    // buffers go; the scratch's go to the communicator.
    for (auto& [w, st] : in_flight) {
      if (!w) continue;
      try {
        w->wait();
      } catch (...) {
      }
    }
    KeepPostedBuffers(comm, scratch);
    throw;
  }
  if (feedback) {
    if (count) std::memcpy(sent_residual, new_sent.data(), count * sizeof(float));
    for (const Slice& sl : slices) {
      const size_t my_count = sl.elem[me + 1] - sl.elem[me];
      if (my_count) std::memcpy(owned_residual + sl.elem[me], sl.new_owned.data(), my_count * sizeof(float));
    }
  }
  return stats;
}

}  // namespace quantized_internal

QuantizedErrorFeedback::QuantizedErrorFeedback(QuantizedAllreduceOptions options) : options_(options) {}

QuantizedAllreduceStats QuantizedErrorFeedback::AllReduce(Communicator& comm, const std::string& key, Buffer data) {
  if (data.count == 0) return QuantizedAllreduce(comm, data, options_);
  auto it = states_.find(key);
  const bool fresh = it == states_.end() || it->second.sent.size() != data.count;
  State started;  // a key's first call (or a new size): zeros, kept only if the call succeeds
  State& s = fresh ? started : it->second;
  if (fresh) {
    s.sent.assign(data.count, 0.0f);
    s.owned.assign(data.count, 0.0f);
  }
  QuantizedResidual residual;
  residual.sent = CpuBuffer(s.sent.data(), s.sent.size());
  residual.owned = CpuBuffer(s.owned.data(), s.owned.size());
  QuantizedAllreduceStats stats = QuantizedAllreduce(comm, data, options_, residual, &scratch_);
  if (fresh) states_[key] = std::move(started);
  return stats;
}

const QuantizedErrorFeedback::State* QuantizedErrorFeedback::state(const std::string& key) const {
  auto it = states_.find(key);
  return it == states_.end() ? nullptr : &it->second;
}

void QuantizedErrorFeedback::set_state(const std::string& key, State state) {
  if (state.sent.size() != state.owned.size()) {
    throw InvalidArgumentError("QuantizedErrorFeedback::set_state(\"" + key + "\"): sent has " +
                               std::to_string(state.sent.size()) + " elements, owned " +
                               std::to_string(state.owned.size()) + "; they must match");
  }
  states_[key] = std::move(state);
}

}  // namespace gossipcc
