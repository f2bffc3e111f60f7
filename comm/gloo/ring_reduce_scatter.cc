#include "comm/gloo/ring_reduce_scatter.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstring>
#include <vector>

#include "comm/core/reduce.h"
#include "comm/gloo/posted_buffers.h"
#include "comm/gloo/slots.h"

namespace gossipcc {
namespace {

// The ring on elements of `dtype` (never half). Result lands in `out`.
void Ring(const GlooCall& call, const void* input, void* out, size_t chunk, DType dtype, ReduceOp op) {
  gloo::Context& ctx = *call.context;
  const int n = ctx.size;
  const int r = ctx.rank;
  const size_t bytes = chunk * ElementSize(dtype);
  const auto* in = static_cast<const uint8_t*>(input);
  if (n == 1) {
    std::memcpy(out, in, bytes);
    return;
  }
  const ReduceFn reduce = GetReduceFn(dtype, op);
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  const uint64_t slot = MakeSlot(kReduceScatterSlotPrefix, call.tag);
  auto mod = [n](int i) { return ((i % n) + n) % n; };

  // recv: incoming partial; acc[2]: alternating outgoing partials (a buffer is overwritten
  // only after the send from it completed).
  // Step s < n-2 writes acc[s % 2]; the last step writes `out` directly, so n = 2 needs no
  // accumulator and n = 3 needs one.
  PostedBuffers buffers(ctx, *call.retired);
  uint8_t* recv = buffers.Allocate(bytes);
  gloo::transport::UnboundBuffer* input_ub = &buffers.Create(const_cast<uint8_t*>(in), bytes * n);
  gloo::transport::UnboundBuffer* recv_ub = &buffers.Create(recv, bytes);
  uint8_t* acc[2] = {nullptr, nullptr};
  gloo::transport::UnboundBuffer* acc_ub[2] = {nullptr, nullptr};
  for (int i = 0; i < 2 && i < n - 2; ++i) {
    acc[i] = buffers.Allocate(bytes);
    acc_ub[i] = &buffers.Create(acc[i], bytes);
  }

  for (int step = 0; step < n - 1; ++step) {
    recv_ub->recv(left, slot);
    if (step == 0) {
      input_ub->send(right, slot, static_cast<size_t>(mod(r - 1)) * bytes, bytes);
    } else {
      acc_ub[(step - 1) % 2]->send(right, slot);
    }
    recv_ub->waitRecv(call.left());
    const int chunk_index = mod(r - step - 2);
    void* dst = step == n - 2 ? out : acc[step % 2];
    reduce(dst, recv, in + static_cast<size_t>(chunk_index) * bytes, chunk);
    if (step == 0) {
      input_ub->waitSend(call.left());
    } else {
      acc_ub[(step - 1) % 2]->waitSend(call.left());
    }
  }
}

}  // namespace

void RingReduceScatter(const GlooCall& call, Buffer input, Buffer output, ReduceOp op) {
  Ring(call, input.data, output.data, output.count, input.dtype, op);
  if (op == ReduceOp::kAvg) {
    ScaleInPlace(output.data, output.count, output.dtype, 1.0 / static_cast<double>(call.context->size));
  }
}

}  // namespace gossipcc
