#include "comm/gloo/collectives.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>

#include <cstring>
#include <memory>

#include "comm/core/options.h"
#include "comm/core/reduce.h"
#include "comm/gloo/direct_allreduce.h"
#include "comm/gloo/hierarchical_allreduce.h"
#include "comm/gloo/packed_ring_allreduce.h"
#include "comm/gloo/posted_buffers.h"
#include "comm/gloo/ring_allreduce.h"
#include "comm/gloo/ring_reduce_scatter.h"

namespace gossipcc {
namespace {

// A Gloo options object for `call` (its context, tag, and what is left of its deadline as the
// timeout Gloo gives each of its waits), shared so that RunOrRetire can keep it past the call.
template <typename Options>
std::shared_ptr<Options> NewOptions(const GlooCall& call) {
  auto opts = std::make_shared<Options>(call.context);
  opts->setTag(call.tag);
  opts->setTimeout(call.left());
  return opts;
}

// Runs `collective(*opts)`. The options own the Gloo buffers the collective posts operations
// on; when it throws (a dead peer, a timeout), Gloo's device thread may still be failing those
// operations, so the options go to call.retired, freed once the pairs are gone
// (RetiredBuffers), instead of dying with this frame.
template <typename Options, typename Collective>
void RunOrRetire(const GlooCall& call, std::shared_ptr<Options> opts, Collective collective) {
  try {
    collective(*opts);
  } catch (...) {
    call.retired->Add(std::move(opts));
    throw;
  }
}

uint8_t* Bytes(const Buffer& b) { return static_cast<uint8_t*>(b.data); }

}  // namespace

void GlooAllreduce(const GlooCall& call, Buffer data, ReduceOp op) {
  // Half precision always goes direct: it accumulates wide with the wire in half width,
  // where a ring would have to send float32 partial sums (direct_allreduce.h).
  if (data.bytes() <= kDirectAllreduceMaxBytes || IsHalfPrecision(data.dtype)) {
    RunCheck(call);
    DirectAllreduce(call, data, op);
    return;
  }
  if (call.lossless_float32 && data.dtype == DType::kFloat32) {
    PackedRingAllreduce(call, data, op);
    return;
  }
  if (call.hierarchy != nullptr) {
    HierarchicalAllreduce(call, *call.hierarchy, data, op);
    return;
  }
  RingAllreduce(call, data, op);
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
  auto opts = NewOptions<gloo::BroadcastOptions>(call);
  opts->setOutput(Bytes(data), data.bytes());
  opts->setRoot(root);
  RunOrRetire(call, std::move(opts), gloo::broadcast);
}

void GlooAllgather(const GlooCall& call, Buffer input, Buffer output) {
  auto opts = NewOptions<gloo::AllgatherOptions>(call);
  // In place when the input already sits at this rank's slot of the output.
  if (Bytes(input) != Bytes(output) + call.context->rank * input.bytes()) opts->setInput(Bytes(input), input.bytes());
  opts->setOutput(Bytes(output), output.bytes());
  RunOrRetire(call, std::move(opts), gloo::allgather);
}

void GlooAllgatherv(const GlooCall& call, Buffer input, Buffer output, const std::vector<size_t>& counts) {
  std::vector<size_t> bytes(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * ElementSize(output.dtype);
  auto opts = NewOptions<gloo::AllgathervOptions>(call);
  opts->setInput(Bytes(input), input.bytes());
  opts->setOutput(Bytes(output), bytes);
  RunOrRetire(call, std::move(opts), gloo::allgatherv);
}

void GlooAlltoall(const GlooCall& call, Buffer input, Buffer output) {
  auto opts = NewOptions<gloo::AlltoallOptions>(call);
  opts->setInput(Bytes(input), input.bytes());
  opts->setOutput(Bytes(output), output.bytes());
  RunOrRetire(call, std::move(opts), gloo::alltoall);
}

void GlooAlltoallv(const GlooCall& call, Buffer input, const std::vector<size_t>& send_counts, Buffer output,
                   const std::vector<size_t>& recv_counts) {
  const size_t es = ElementSize(input.dtype);
  std::vector<int64_t> in_bytes(send_counts.size()), out_bytes(recv_counts.size());
  for (size_t i = 0; i < send_counts.size(); ++i) in_bytes[i] = static_cast<int64_t>(send_counts[i] * es);
  for (size_t i = 0; i < recv_counts.size(); ++i) out_bytes[i] = static_cast<int64_t>(recv_counts[i] * es);
  auto opts = NewOptions<gloo::AlltoallvOptions>(call);
  opts->setInput(Bytes(input), in_bytes);
  opts->setOutput(Bytes(output), out_bytes);
  RunOrRetire(call, std::move(opts), gloo::alltoallv);
}

void GlooBarrier(const GlooCall& call) {
  RunOrRetire(call, NewOptions<gloo::BarrierOptions>(call), gloo::barrier);
}

}  // namespace gossipcc
