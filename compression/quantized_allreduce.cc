#include "compression/quantized_allreduce.h"

#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <utility>

#include "comm/core/errors.h"
#include "compression/quantized_blocks.h"
#include "compression/quantized_check.h"
#include "compression/quantized_plan.h"
#include "compression/quantized_ring_gather.h"

namespace gossipcc {
namespace quantized_internal {
namespace {

// The call's plan and memory (step 2 of QuantizedAllreduceChecked). Every byte of the quantized
// buffer that is read was written by this call (the codec writes whole blocks, padding
// included), so a kept scratch's old contents never matter.
QuantizedCall PrepareCall(Communicator& comm, Buffer data, const QuantizedAllreduceOptions& options,
                          const QuantizedResidual& residual, QuantizedAllreduceScratch& scratch) {
  const bool feedback = residual.enabled();
  QuantizedCall call{comm,
                     comm.size(),
                     comm.rank(),
                     options.bits,
                     options.block_size,
                     data.count,
                     options.op,
                     static_cast<float*>(data.data),
                     feedback ? static_cast<float*>(residual.sent.data) : nullptr,
                     feedback ? static_cast<float*>(residual.owned.data) : nullptr,
                     std::vector<float>(feedback ? data.count : 0),
                     PlanSlices(data.count, options.block_size, options.bits, comm.size()),
                     nullptr,
                     &scratch.sum,
                     {}};
  call.stats.quantized_bytes = QuantizedBytes(call.count, call.bits, call.block);
  if (scratch.quantized.size() < call.stats.quantized_bytes) scratch.quantized.resize(call.stats.quantized_bytes);
  call.quantized = scratch.quantized.data();
  if (scratch.received.size() < call.slices.size()) scratch.received.resize(call.slices.size());
  for (size_t s = 0; s < call.slices.size(); ++s) {
    auto& received = scratch.received[s];
    const size_t bytes = call.slices[s].range_bytes[call.me] * call.n;
    if (received.size() < bytes) received.resize(bytes);
    call.slices[s].received = received.data();
  }
  return call;
}

// Steps 3-4: the scatter rounds with the CPU work between them, in this order on every rank:
// per slice the n - 1 scatter rounds, then (a buffer of at most kQuantizedEagerBytes quantized,
// "eager") per slice the n - 1 gather rounds; a larger buffer gathers in a ring afterwards
// (RingGather). In round r a rank sends to rank + r and receives from rank - r. Quantizing,
// summing and dequantizing run while a round is on the wire; a round is issued as soon as the
// previous one is done and its data is ready. One round in flight at a time (each host's link
// carries one stream each way), except eager: then the call is bound by latency, not by the
// link, and every round that is ready goes at once.
class ScatterRounds {
 public:
  explicit ScatterRounds(QuantizedCall& call)
      : c_(call),
        eager_(call.stats.quantized_bytes <= kQuantizedEagerBytes),
        before_sum_(call.slices.size(), call.n),
        summed_(call.slices.size(), 0),
        region_ready_(call.slices.size(), std::vector<char>(call.n, 0)) {
    const size_t num_slices = c_.slices.size();
    for (int phase = 0; phase < (eager_ ? 2 : 1); ++phase) {
      for (size_t s = 0; s < num_slices; ++s) {
        for (int r = 1; r < c_.n; ++r) steps_.push_back({phase == 1, s, r});
      }
    }
    // Quantization in the order the rounds send it: per slice, owner rank + 1's region first
    // (the first round waits for that region only), this rank's own last.
    for (size_t s = 0; s < num_slices; ++s) {
      for (int r = 1; r <= c_.n; ++r) units_.emplace_back(s, (c_.me + r) % c_.n);
    }
  }

  bool eager() const { return eager_; }

  // Runs every round and its CPU work; on a failure waits for every round posted, then rethrows.
  void Run() {
    const size_t window = eager_ ? steps_.size() : 1;
    try {
      while (DoNext(window)) {
      }
    } catch (...) {
      for (auto& [w, st] : in_flight_) {
        if (!w) continue;
        try {
          w->wait();
        } catch (...) {
        }
      }
      throw;
    }
  }

 private:
  struct Step {
    bool gather;
    size_t slice;
    int round;
  };

  // One thing to do, the first that can be done of: issue the next round, dequantize this
  // rank's own sum, use a round's data, quantize the next region, wait for the oldest round.
  // False once every round is done and its data used.
  bool DoNext(size_t window) {
    if (in_flight_.size() < window && next_ < steps_.size() && Ready(steps_[next_])) {
      const Step* st = &steps_[next_++];
      in_flight_.emplace_back(Issue(*st), st);
    } else if (!own_region_pending_.empty()) {
      Dequantize(c_.slices[own_region_pending_.back()], c_.me);
      own_region_pending_.pop_back();
    } else if (!arrived_.empty()) {
      const Step* st = arrived_.back();
      arrived_.pop_back();
      if (!st->gather) {
        OneLessBeforeSum(st->slice);
      } else {
        Dequantize(c_.slices[st->slice], (c_.me - st->round + c_.n) % c_.n);
      }
    } else if (quantized_units_ < units_.size()) {
      const auto [s, o] = units_[quantized_units_++];
      Quantize(s, o);
      if (o == c_.me) OneLessBeforeSum(s);
    } else if (!in_flight_.empty()) {
      auto [w, st] = std::move(in_flight_.front());
      in_flight_.pop_front();
      if (w) w->wait();
      arrived_.push_back(st);
    } else {
      return false;
    }
    return true;
  }

  bool Ready(const Step& st) const {
    return st.gather ? summed_[st.slice] != 0 : region_ready_[st.slice][(c_.me + st.round) % c_.n] != 0;
  }

  // One round: a batch of this rank's send and receive (either may be empty: a rank owning no
  // block of a small slice).
  std::shared_ptr<Work> Issue(const Step& st) {
    Slice& sl = c_.slices[st.slice];
    const int to = (c_.me + st.round) % c_.n, from = (c_.me - st.round + c_.n) % c_.n;
    const size_t my_bytes = sl.range_bytes[c_.me];
    std::vector<P2POp> ops;
    if (!st.gather) {
      // This rank's quantized copy of `to`'s blocks; `from`'s copy of this rank's blocks.
      if (sl.range_bytes[to]) {
        ops.push_back(P2POp::Send(CpuBuffer(c_.quantized + sl.byte[to], sl.range_bytes[to]), to, kQuantizedAllreduceTag));
      }
      if (my_bytes) {
        ops.push_back(P2POp::Recv(CpuBuffer(sl.received + static_cast<size_t>(from) * my_bytes, my_bytes), from,
                                  kQuantizedAllreduceTag));
      }
    } else {
      // This rank's quantized sum; `from`'s sum, into its region.
      if (my_bytes) ops.push_back(P2POp::Send(CpuBuffer(c_.quantized + sl.byte[c_.me], my_bytes), to, kQuantizedAllreduceTag));
      if (sl.range_bytes[from]) {
        ops.push_back(P2POp::Recv(CpuBuffer(c_.quantized + sl.byte[from], sl.range_bytes[from]), from,
                                  kQuantizedAllreduceTag));
      }
    }
    if (ops.empty()) return nullptr;
    if (ops[0].kind == P2POp::Kind::kSend) c_.stats.bytes_sent += ops[0].buffer.count;
    return c_.comm.p2p(ops);
  }

  // Owner o's region of slice s, quantized (with this rank's sent residual) into its place.
  void Quantize(size_t s, int o) {
    Slice& sl = c_.slices[s];
    const size_t e0 = sl.elem[o], e1 = sl.elem[o + 1];
    QuantizeRange(c_.x + e0, c_.feedback() ? c_.sent_residual + e0 : nullptr,
                  c_.feedback() ? c_.new_sent.data() + e0 : nullptr, e1 - e0, c_.bits, c_.block,
                  c_.quantized + sl.byte[o]);
    if (o == c_.me) {
      const size_t my_bytes = sl.range_bytes[c_.me];
      if (my_bytes) {  // (an empty region: no pointer to copy from)
        std::memcpy(sl.received + static_cast<size_t>(c_.me) * my_bytes, c_.quantized + sl.byte[c_.me], my_bytes);
      }
    }
    region_ready_[s][o] = 1;
  }

  // A slice's sum waits for its n - 1 scatter rounds and this rank's own region quantized.
  void OneLessBeforeSum(size_t s) {
    if (--before_sum_[s] > 0) return;
    ReduceOwned(c_.slices[s]);
    summed_[s] = 1;
    // Dequantized into this rank's own region once the first gather round, which needs only the
    // quantized sum, is on the wire (RingGather does its own).
    if (eager_) own_region_pending_.push_back(s);
  }

  // Every rank's copy of this rank's blocks, dequantized and added in rank order in float32,
  // quantized again (with the owned residual) into this rank's region.
  void ReduceOwned(Slice& sl) {
    const size_t my_bytes = sl.range_bytes[c_.me];
    const size_t my_begin = sl.elem[c_.me], my_count = sl.elem[c_.me + 1] - my_begin;
    std::vector<float>& sum = *c_.sum;
    if (sum.size() < my_count) sum.resize(my_count);
    for (int r = 0; r < c_.n; ++r) {
      DequantizeRange(sl.received + static_cast<size_t>(r) * my_bytes, my_count, c_.bits, c_.block, sum.data(),
                      /*add=*/r > 0);
    }
    if (c_.op == ReduceOp::kAvg) {
      const float ranks = static_cast<float>(c_.n);
      for (size_t i = 0; i < my_count; ++i) sum[i] /= ranks;
    }
    sl.new_owned.resize(c_.feedback() ? my_count : 0);
    QuantizeRange(sum.data(), c_.feedback() ? c_.owned_residual + my_begin : nullptr,
                  c_.feedback() ? sl.new_owned.data() : nullptr, my_count, c_.bits, c_.block,
                  c_.quantized + sl.byte[c_.me]);
  }

  // Every rank dequantizes the same bytes: owner o's region of a slice once o's sum is here.
  void Dequantize(const Slice& sl, int o) {
    DequantizeRange(c_.quantized + sl.byte[o], sl.elem[o + 1] - sl.elem[o], c_.bits, c_.block, c_.x + sl.elem[o],
                    /*add=*/false);
  }

  QuantizedCall& c_;
  const bool eager_;
  std::vector<Step> steps_;
  std::vector<std::pair<size_t, int>> units_;  // (slice, owner) regions in quantization order
  std::vector<int> before_sum_;
  std::vector<char> summed_;
  std::vector<std::vector<char>> region_ready_;
  std::vector<size_t> own_region_pending_;
  size_t next_ = 0, quantized_units_ = 0;
  std::deque<std::pair<std::shared_ptr<Work>, const Step*>> in_flight_;  // issued, not waited for
  std::vector<const Step*> arrived_;  // rounds waited for whose data is not yet used
};

// Step 5: the residuals this call leaves, written only once every step succeeded.
void CommitResiduals(const QuantizedCall& call) {
  if (!call.feedback()) return;
  std::memcpy(call.sent_residual, call.new_sent.data(), call.count * sizeof(float));
  for (const Slice& sl : call.slices) {
    const size_t my_count = sl.elem[call.me + 1] - sl.elem[call.me];
    if (my_count) std::memcpy(call.owned_residual + sl.elem[call.me], sl.new_owned.data(), my_count * sizeof(float));
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

QuantizedAllreduceStats QuantizedAllreduceChecked(Communicator& comm, Buffer data,
                                                  const QuantizedAllreduceOptions& options, QuantizedResidual residual,
                                                  QuantizedAllreduceScratch* kept_scratch) {
  if (data.count == 0) return {};
  QuantizedAllreduceScratch call_scratch;  // used when the caller keeps none
  QuantizedAllreduceScratch& scratch = kept_scratch ? *kept_scratch : call_scratch;
  // 2. The plan: slices, owners, memory.
  QuantizedCall call = PrepareCall(comm, data, options, residual, scratch);
  try {
    // 3-4. Quantize, scatter, sum the owned blocks and quantize them again; a small buffer
    // gathers the sums in the same rounds,
    ScatterRounds rounds(call);
    rounds.Run();
    // a larger one in a ring.
    if (!rounds.eager()) RingGather(call);
  } catch (...) {
    KeepPostedBuffers(comm, scratch);
    throw;
  }
  // 5. Error feedback's residuals.
  CommitResiduals(call);
  return call.stats;
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

size_t QuantizedBytes(size_t count, int bits, size_t block_size) {
  return quantized_internal::EncodedBytes(count, bits, block_size);
}

std::vector<std::pair<size_t, size_t>> QuantizedOwnedRanges(size_t count, size_t block_size, int rank, int ranks) {
  std::vector<std::pair<size_t, size_t>> out;
  if (block_size < 1 || ranks < 1 || rank < 0 || rank >= ranks) return out;
  for (const quantized_internal::Slice& sl : quantized_internal::PlanSlices(count, block_size, 8, ranks)) {
    if (sl.elem[rank + 1] > sl.elem[rank]) out.emplace_back(sl.elem[rank], sl.elem[rank + 1]);
  }
  return out;
}

double QuantizedAllreduceErrorBound(int bits, int ranks, double sum_of_block_maxima, ReduceOp op) {
  const double relative = 1.0 / quantized_internal::LevelsOf(bits) + (ranks + 32) * std::ldexp(1.0, -24);
  const double scaled = relative * sum_of_block_maxima;
  return (op == ReduceOp::kAvg ? scaled / ranks : scaled) + std::ldexp(1.0, -96);
}

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
