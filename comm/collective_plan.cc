#include "comm/collective_plan.h"

#include <gloo/context.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "comm/core/options.h"
#include "comm/gloo/collectives.h"
#include "comm/gloo/consistency_check.h"
#include "comm/gloo/eager_collectives.h"
#include "comm/nccl/nccl_transport.h"

namespace gossipcc {
namespace {

size_t Sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

absl::Span<const uint8_t> BytesOf(const Buffer& b) {
  return absl::Span<const uint8_t>(static_cast<const uint8_t*>(b.data), b.bytes());
}

OpSpec Spec(OpKind kind, const Buffer& b, uint64_t count) {
  OpSpec s;
  s.kind = kind;
  s.dtype = b.dtype;
  s.device = b.device;
  s.count = count;
  return s;
}

// The eager plan of a CPU collective whose largest per-rank payload is `bytes` (the same on
// every rank), or no plan (not eager) when it does not fit EagerCollectiveMaxBytes.
EagerPlan Eager(int size, const Device& device, size_t bytes, absl::Span<const uint8_t> payload, EagerFinish finish) {
  if (size == 1 || device.is_cuda() || bytes > EagerCollectiveMaxBytes(size)) return {};
  return {payload, std::move(finish)};
}

}  // namespace

CollectivePlan PlanAllreduce(int size, Buffer data, ReduceOp op) {
  CollectivePlan plan;
  plan.spec = Spec(OpKind::kAllreduce, data, data.count);
  plan.spec.op = op;
  plan.footprint = Footprint::Of({data});
  plan.cpu = [=](const GlooCall& call) {
    if (data.count) {
      GlooAllreduce(call, data, op);
    } else {
      RunCheck(call);
    }
  };
  plan.cuda = [=](NcclTransport& n, std::string d) { return n.Allreduce(data, op, std::move(d)); };
  plan.payload_bytes = data.bytes();
  plan.eager = Eager(size, data.device, data.bytes(), BytesOf(data),
                     [size, data, op](const CollectiveHandshake& h, CollectiveScratch& scratch) {
                       EagerAllreduce(h, size, data, op, scratch.wide);
                     });
  plan.checks_itself = true;
  return plan;
}

CollectivePlan PlanBroadcast(int rank, int size, Buffer data, int root) {
  CollectivePlan plan;
  plan.spec = Spec(OpKind::kBroadcast, data, data.count);
  plan.spec.root = root;
  plan.footprint = Footprint::Of({data});
  plan.cpu = [=](const GlooCall& call) {
    if (data.count && call.context->size > 1) GlooBroadcast(call, data, root);
  };
  plan.cuda = [=](NcclTransport& n, std::string d) { return n.Broadcast(data, root, std::move(d)); };
  plan.payload_bytes = data.bytes();
  plan.eager = Eager(size, data.device, data.bytes(), rank == root ? BytesOf(data) : absl::Span<const uint8_t>(),
                     [data, root, rank](const CollectiveHandshake& h, CollectiveScratch&) {
                       EagerBroadcast(h, rank, data, root);
                     });
  return plan;
}

CollectivePlan PlanAllgather(int size, Buffer input, Buffer output) {
  CollectivePlan plan;
  plan.spec = Spec(OpKind::kAllgather, input, input.count);
  plan.footprint = Footprint::Of({input, output});
  plan.cpu = [=](const GlooCall& call) {
    if (input.count) GlooAllgather(call, input, output);
  };
  plan.cuda = [=](NcclTransport& n, std::string d) { return n.Allgather(input, output, std::move(d)); };
  plan.payload_bytes = input.bytes();
  plan.eager = Eager(size, input.device, input.bytes(), BytesOf(input),
                     [output, counts = std::vector<size_t>(size, input.count), size](const CollectiveHandshake& h,
                                                                                     CollectiveScratch&) {
                       EagerAllgatherv(h, size, output, counts);
                     });
  return plan;
}

CollectivePlan PlanAllgatherv(int size, Buffer input, Buffer output, std::vector<size_t> counts) {
  const size_t total = Sum(counts);
  CollectivePlan plan;
  plan.spec = Spec(OpKind::kAllgatherv, input, total);
  plan.spec.layout_hash = HashCounts(counts);
  plan.footprint = Footprint::Of({input, output});
  plan.cpu = [=](const GlooCall& call) {
    if (total) GlooAllgatherv(call, input, output, counts);
  };
  plan.cuda = [=](NcclTransport& n, std::string d) { return n.Allgatherv(input, output, counts, std::move(d)); };
  plan.payload_bytes = input.bytes();
  // Decided from the counts vector, which every rank must pass alike (checked), not from this
  // rank's own count, so all ranks choose the same plan.
  plan.eager = Eager(size, input.device, *std::max_element(counts.begin(), counts.end()) * ElementSize(input.dtype),
                     BytesOf(input), [output, counts, size](const CollectiveHandshake& h, CollectiveScratch&) {
                       EagerAllgatherv(h, size, output, counts);
                     });
  return plan;
}

CollectivePlan PlanReduceScatter(int rank, int size, Buffer input, Buffer output, ReduceOp op) {
  CollectivePlan plan;
  plan.spec = Spec(OpKind::kReduceScatter, input, output.count);
  plan.spec.op = op;
  plan.footprint = Footprint::Of({input, output});
  plan.cpu = [=](const GlooCall& call) { GlooReduceScatter(call, input, output, op); };
  plan.cuda = [=](NcclTransport& n, std::string d) { return n.ReduceScatter(input, output, op, std::move(d)); };
  plan.payload_bytes = input.bytes();
  plan.eager = Eager(size, input.device, input.bytes(), BytesOf(input),
                     [rank, size, output, op](const CollectiveHandshake& h, CollectiveScratch& scratch) {
                       EagerReduceScatter(h, size, rank, output, op, scratch.wide);
                     });
  return plan;
}

CollectivePlan PlanAlltoall(int size, Buffer input, Buffer output) {
  const std::vector<size_t> counts(size, input.count / size);
  CollectivePlan plan;
  plan.spec = Spec(OpKind::kAlltoall, input, input.count);
  plan.footprint = Footprint::Of({input, output});
  plan.cpu = [=](const GlooCall& call) {
    if (input.count) GlooAlltoall(call, input, output);
  };
  plan.cuda = [=](NcclTransport& n, std::string d) { return n.Alltoallv(input, counts, output, counts, std::move(d)); };
  plan.payload_bytes = input.bytes();
  return plan;
}

CollectivePlan PlanAlltoallv(Buffer input, std::vector<size_t> send_counts, Buffer output,
                             std::vector<size_t> recv_counts) {
  CollectivePlan plan;
  plan.spec = Spec(OpKind::kAlltoallv, input, 0);
  plan.spec.send_counts = send_counts;
  plan.spec.recv_counts = recv_counts;
  plan.footprint = Footprint::Of({input, output});
  plan.cpu = [=](const GlooCall& call) {
    if (call.context->size == 1) {
      if (input.count) std::memcpy(output.data, input.data, input.bytes());
    } else {
      GlooAlltoallv(call, input, send_counts, output, recv_counts);
    }
  };
  plan.cuda = [=](NcclTransport& n, std::string d) {
    return n.Alltoallv(input, send_counts, output, recv_counts, std::move(d));
  };
  plan.payload_bytes = input.bytes();
  return plan;
}

CollectivePlan PlanBarrier(int size) {
  CollectivePlan plan;
  plan.spec.kind = OpKind::kBarrier;
  plan.footprint = Footprint::Fence();
  plan.cpu = [](const GlooCall& call) { GlooBarrier(call); };
  plan.cuda = [](NcclTransport& n, std::string d) { return n.Barrier(std::move(d)); };
  // A CPU barrier is the handshake alone: a rank gets past it only once every peer's header
  // (sent on entering the barrier) has arrived.
  plan.eager = Eager(size, plan.spec.device, 0, {}, [](const CollectiveHandshake&, CollectiveScratch&) {});
  return plan;
}

}  // namespace gossipcc
