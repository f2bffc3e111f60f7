#include "comm/gloo/direct_allreduce.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/core/options.h"
#include "comm/core/reduce.h"
#include "comm/gloo/posted_buffers.h"
#include "comm/gloo/slots.h"

namespace gossipcc {
namespace {

using gloo::transport::UnboundBuffer;

// Where the peers' copies of this rank's block land: one slot of `stride` bytes per rank.
// Kept by the communicator across calls, so steady-state calls neither allocate nor fault
// pages in; slot `me` holds this rank's own block when the reduction may not read it in place.
class Staging {
 public:
  Staging(const GlooCall& call, PostedBuffers& buffers, size_t stride) : stride_(stride) {
    std::vector<uint8_t>& bytes = call.scratch->bytes;
    const size_t total = stride * static_cast<size_t>(call.context->size);
    if (bytes.size() < total) bytes.resize(total);
    base_ = bytes.data();
    ub_ = &buffers.Create(base_, total);
  }
  uint8_t* slot(int r) const { return base_ + static_cast<size_t>(r) * stride_; }
  size_t offset(int r) const { return static_cast<size_t>(r) * stride_; }
  UnboundBuffer& ub() const { return *ub_; }

 private:
  size_t stride_;
  uint8_t* base_;
  UnboundBuffer* ub_;
};

// Operations posted on one unbound buffer whose completions have not been waited for yet.
struct Pending {
  int sends = 0;
  int recvs = 0;
};

// Waits until at most `keep_sends`/`keep_recvs` operations remain un-waited on `ub`. Gloo
// counts completions per buffer, not per operation, so this bounds how much is in flight;
// only draining to zero proves that particular operations finished. Each wait gets what is
// left of the call's deadline.
void Drain(UnboundBuffer& ub, Pending& pending, int keep_sends, int keep_recvs, const GlooCall& call) {
  for (; pending.recvs > keep_recvs; --pending.recvs) ub.waitRecv(call.left());
  for (; pending.sends > keep_sends; --pending.sends) ub.waitSend(call.left());
}

// Phase 1 (reduce-scatter) of one slice. To each peer p: count_of(p) elements at byte
// offset_of(p) of `send`. From each peer: its copy of this rank's block (`out.count`
// elements) into staging. Then out <- the reduction, in rank order, of those copies and
// `own` (this rank's copy, which `out` may alias).
template <typename OffsetOf, typename CountOf>
void ScatterReduce(const GlooCall& call, UnboundBuffer& send, Pending& send_pending, OffsetOf offset_of,
                   CountOf count_of, const void* own, Buffer out, ReduceOp op, const Staging& staging,
                   std::vector<const void*>& sources) {
  const gloo::Context& ctx = *call.context;
  const int n = ctx.size;
  const int me = ctx.rank;
  const size_t element = ElementSize(out.dtype);
  const uint64_t slot = MakeSlot(kDirectAllreduceScatterSlotPrefix, call.tag);
  // (Blocks are empty for all ranks alike when a slice has fewer elements than ranks, so
  // empty messages are skipped on both ends consistently.)
  int recvs = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (out.count) {
      staging.ub().recv(p, slot, staging.offset(p), out.bytes());
      ++recvs;
    }
    if (count_of(p)) {
      send.send(p, slot, offset_of(p), count_of(p) * element);
      ++send_pending.sends;
    }
  }
  for (int i = 0; i < recvs; ++i) staging.ub().waitRecv(call.left());
  if (out.count == 0) return;
  // ReduceInRankOrder may write over sources 0 and 1 only (any source for half dtypes): a
  // later rank's own block moves aside first when it is also the output.
  const void* own_source = own;
  if (own == out.data && me >= 2 && !IsHalfPrecision(out.dtype)) {
    std::memcpy(staging.slot(me), own, out.bytes());
    own_source = staging.slot(me);
  }
  sources.resize(n);
  for (int r = 0; r < n; ++r) sources[r] = r == me ? own_source : staging.slot(r);
  ReduceInRankOrder(sources, out, op, call.scratch->wide);
}

}  // namespace

void DirectAllreduce(const GlooCall& call, Buffer data, ReduceOp op) {
  gloo::Context& ctx = *call.context;
  const int n = ctx.size;
  const int me = ctx.rank;
  if (n == 1 || data.count == 0) return;  // one rank: the average of one value is itself
  const size_t element = ElementSize(data.dtype);
  const size_t slice_count = std::max(kDirectSliceBytes / element, static_cast<size_t>(n));
  auto* base = static_cast<uint8_t*>(data.data);
  PostedBuffers buffers(ctx, *call.retired);
  Staging staging(call, buffers, (std::min(slice_count, data.count) + n - 1) / n * element);
  UnboundBuffer* data_ub = &buffers.Create(base, data.bytes());
  const uint64_t gather_slot = MakeSlot(kDirectAllreduceGatherSlotPrefix, call.tag);
  std::vector<const void*> sources;
  Pending pending;

  for (size_t offset = 0; offset < data.count; offset += slice_count) {
    const size_t count = std::min(slice_count, data.count - offset);
    auto begin = [&](int r) { return offset + count * static_cast<size_t>(r) / static_cast<size_t>(n); };
    auto chunk = [&](int r) { return begin(r + 1) - begin(r); };
    const int pending_before = pending.sends;
    const int recvs_before = pending.recvs;

    // Phase 2's receives go up first, so that each peer finds them announced when it has its
    // reduced chunk and sends at once (Gloo sends only to an announced receive). They may: a
    // peer sends chunk p only after receiving chunk p of ours in phase 1, so phase 1's send of
    // that region is over by the time anything lands in it.
    for (int p = 0; p < n; ++p) {
      if (p != me && chunk(p)) {
        data_ub->recv(p, gather_slot, begin(p) * element, chunk(p) * element);
        ++pending.recvs;
      }
    }
    uint8_t* mine = base + begin(me) * element;
    ScatterReduce(
        call, *data_ub, pending, [&](int p) { return begin(p) * element; }, chunk, mine,
        Buffer{mine, chunk(me), data.dtype, data.device}, op, staging, sources);
    // Phase 2: the reduced chunk `me` to every peer.
    for (int p = 0; p < n; ++p) {
      if (p != me && chunk(me)) {
        data_ub->send(p, gather_slot, begin(me) * element, chunk(me) * element);
        ++pending.sends;
      }
    }
    // This slice's all-gather stays in flight while the next slice's reduce-scatter runs (it
    // touches other memory); the previous slice's is waited for, bounding what is posted.
    Drain(*data_ub, pending, pending.sends - pending_before, pending.recvs - recvs_before, call);
  }
  Drain(*data_ub, pending, 0, 0, call);
}

void DirectReduceScatter(const GlooCall& call, Buffer input, Buffer output, ReduceOp op) {
  gloo::Context& ctx = *call.context;
  const int n = ctx.size;
  const int me = ctx.rank;
  const size_t block = output.count;
  const size_t element = ElementSize(input.dtype);
  const auto* in = static_cast<const uint8_t*>(input.data);
  auto* out = static_cast<uint8_t*>(output.data);
  if (block == 0) return;
  if (n == 1) {
    if (out != in) std::memmove(out, in, output.bytes());
    return;
  }
  // A slice is the same element range [a, a + count) of every rank's block.
  const size_t slice_count = std::max<size_t>(kDirectSliceBytes / element / static_cast<size_t>(n), 1);
  PostedBuffers buffers(ctx, *call.retired);
  Staging staging(call, buffers, std::min(slice_count, block) * element);
  UnboundBuffer* input_ub = &buffers.Create(const_cast<uint8_t*>(in), input.bytes());
  std::vector<const void*> sources;
  Pending pending;
  for (size_t a = 0; a < block; a += slice_count) {
    const size_t count = std::min(slice_count, block - a);
    const int pending_before = pending.sends;
    ScatterReduce(
        call, *input_ub, pending,
        [&](int p) { return (static_cast<size_t>(p) * block + a) * element; }, [&](int) { return count; },
        in + (static_cast<size_t>(me) * block + a) * element,
        Buffer{out + a * element, count, output.dtype, output.device}, op, staging, sources);
    Drain(*input_ub, pending, pending.sends - pending_before, 0, call);
  }
  Drain(*input_ub, pending, 0, 0, call);
}

}  // namespace gossipcc
