#include "comm/gloo_collectives.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>

#include <cstring>
#include <memory>

#include "comm/direct_allreduce.h"
#include "comm/gloo_util.h"
#include "comm/reduce.h"
#include "comm/ring_reduce_scatter.h"

namespace gossipcc {
namespace {

// Runs `collective` on a Gloo options object built by `configure`. The options own the Gloo
// buffers the collective posts operations on; when it throws (a dead peer, a timeout), Gloo's
// device thread may still be failing those operations, so the options go to call.retired,
// freed once the pairs are gone (RetiredBuffers), instead of dying with this frame.
template <typename Options, typename Configure, typename Collective>
void RunGlooCollective(const GlooCall& call, Configure configure, Collective collective) {
  auto opts = std::make_shared<Options>(call.context);
  configure(*opts);
  opts->setTag(call.tag);
  opts->setTimeout(call.timeout);
  try {
    collective(*opts);
  } catch (...) {
    call.retired->Add(std::move(opts));
    throw;
  }
}

// Gloo's allreduce is typed only by element size; the reduction is our kernel. Works on
// the caller's memory in place: no staging copy.
template <typename Word>
void AllreduceWords(const GlooCall& call, void* data, size_t count, ReduceFn fn) {
  RunGlooCollective<gloo::AllreduceOptions>(
      call,
      [&](gloo::AllreduceOptions& opts) {
        opts.setOutput(static_cast<Word*>(data), count);
        opts.setReduceFunction([fn](void* c, const void* a, const void* b, size_t n) { fn(c, a, b, n); });
      },
      [](gloo::AllreduceOptions& opts) { gloo::allreduce(opts); });
}

void AllreduceRaw(const GlooCall& call, void* data, size_t count, DType dtype, ReduceFn fn) {
  switch (ElementSize(dtype)) {
    case 1: AllreduceWords<uint8_t>(call, data, count, fn); break;
    case 2: AllreduceWords<uint16_t>(call, data, count, fn); break;
    case 4: AllreduceWords<uint32_t>(call, data, count, fn); break;
    case 8: AllreduceWords<uint64_t>(call, data, count, fn); break;
  }
}

uint8_t* Bytes(const Buffer& b) { return static_cast<uint8_t*>(b.data); }

}  // namespace

void GlooAllreduce(const GlooCall& call, Buffer data, ReduceOp op) {
  // Half precision always goes direct: it accumulates wide with the wire in half width,
  // where a ring would have to send float32 partial sums (direct_allreduce.h).
  if (data.bytes() <= kDirectAllreduceMaxBytes || IsHalfPrecision(data.dtype)) {
    DirectAllreduce(call, data, op);
    return;
  }
  AllreduceRaw(call, data.data, data.count, data.dtype, GetReduceFn(data.dtype, op));
  if (op == ReduceOp::kAvg) {
    ScaleInPlace(data.data, data.count, data.dtype, 1.0 / static_cast<double>(call.context->size));
  }
}

void GlooReduceScatter(const GlooCall& call, Buffer input, Buffer output, ReduceOp op) {
  if (output.count == 0) return;
  if (IsHalfPrecision(input.dtype)) {
    DirectReduceScatter(call, input, output, op);
  } else {
    RingReduceScatter(call, input, output, op);
  }
}

void GlooBroadcast(const GlooCall& call, Buffer data, int root) {
  RunGlooCollective<gloo::BroadcastOptions>(
      call,
      [&](gloo::BroadcastOptions& opts) {
        opts.setOutput(Bytes(data), data.bytes());
        opts.setRoot(root);
      },
      [](gloo::BroadcastOptions& opts) { gloo::broadcast(opts); });
}

void GlooAllgather(const GlooCall& call, Buffer input, Buffer output) {
  RunGlooCollective<gloo::AllgatherOptions>(
      call,
      [&](gloo::AllgatherOptions& opts) {
        // In place when the input already sits at this rank's slot of the output.
        if (Bytes(input) != Bytes(output) + call.context->rank * input.bytes()) {
          opts.setInput(Bytes(input), input.bytes());
        }
        opts.setOutput(Bytes(output), output.bytes());
      },
      [](gloo::AllgatherOptions& opts) { gloo::allgather(opts); });
}

void GlooAllgatherv(const GlooCall& call, Buffer input, Buffer output, const std::vector<size_t>& counts) {
  std::vector<size_t> bytes(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * ElementSize(output.dtype);
  RunGlooCollective<gloo::AllgathervOptions>(
      call,
      [&](gloo::AllgathervOptions& opts) {
        opts.setInput(Bytes(input), input.bytes());
        opts.setOutput(Bytes(output), bytes);
      },
      [](gloo::AllgathervOptions& opts) { gloo::allgatherv(opts); });
}

void GlooAlltoall(const GlooCall& call, Buffer input, Buffer output) {
  RunGlooCollective<gloo::AlltoallOptions>(
      call,
      [&](gloo::AlltoallOptions& opts) {
        opts.setInput(Bytes(input), input.bytes());
        opts.setOutput(Bytes(output), output.bytes());
      },
      [](gloo::AlltoallOptions& opts) { gloo::alltoall(opts); });
}

void GlooAlltoallv(const GlooCall& call, Buffer input, const std::vector<size_t>& send_counts, Buffer output,
                   const std::vector<size_t>& recv_counts) {
  const size_t es = ElementSize(input.dtype);
  std::vector<int64_t> in_bytes(send_counts.size()), out_bytes(recv_counts.size());
  for (size_t i = 0; i < send_counts.size(); ++i) in_bytes[i] = static_cast<int64_t>(send_counts[i] * es);
  for (size_t i = 0; i < recv_counts.size(); ++i) out_bytes[i] = static_cast<int64_t>(recv_counts[i] * es);
  RunGlooCollective<gloo::AlltoallvOptions>(
      call,
      [&](gloo::AlltoallvOptions& opts) {
        opts.setInput(Bytes(input), in_bytes);
        opts.setOutput(Bytes(output), out_bytes);
      },
      [](gloo::AlltoallvOptions& opts) { gloo::alltoallv(opts); });
}

void GlooBarrier(const GlooCall& call) {
  RunGlooCollective<gloo::BarrierOptions>(
      call, [](gloo::BarrierOptions&) {}, [](gloo::BarrierOptions& opts) { gloo::barrier(opts); });
}

}  // namespace gossipcc
