// GossipCollectives::quantized_allreduce: the lossy 8/4-bit all-reduce of
// compression/quantized_allreduce.h on the group's algorithm lane; on hosts of several ranks (the
// communicator's hierarchical()), compressed only across hosts
// (compression/hierarchical_quantized_allreduce.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "comm/core/errors.h"
#include "comm/host_groups.h"
#include "compression/hierarchical_quantized_allreduce.h"
#include "compression/quantized_allreduce.h"
#include "torch_backend/gossip_collectives.h"
#include "torch_backend/tensor_buffer.h"

namespace gossipcc {
namespace torch_backend {

c10::intrusive_ptr<::c10d::Work> GossipCollectives::quantized_allreduce(std::vector<at::Tensor> tensors,
                                                                           int64_t bits, bool average,
                                                                           std::optional<at::Tensor> residual,
                                                                           std::optional<at::Tensor> owned_residual,
                                                                           int64_t block_size) {
  const char* op = "quantized_allreduce";
  // Structural checks at the call (as every gossipcc collective): defined, contiguous, one
  // dtype and device. The values every rank must agree on or that the algorithm cannot take
  // (bits, block size, dtype other than float32, CUDA, the residuals' sizes) are checked by the
  // collective itself, so that every rank raises the same error.
  std::vector<Buffer> buffers = FloatingBuffers(tensors, op);
  if (residual.has_value() != owned_residual.has_value()) {
    throw InvalidArgumentError("gossipcc quantized_allreduce: pass both residual and owned_residual (error feedback) "
                               "or neither");
  }
  QuantizedResidual feedback;
  if (residual) {
    feedback.sent = ToBuffer(*residual, op, "residual");
    feedback.owned = ToBuffer(*owned_residual, op, "owned_residual");
  }
  QuantizedAllreduceOptions options;
  // Out-of-range values travel as they are (clamped into the header's int) and fail on every rank.
  options.bits = static_cast<int>(std::max<int64_t>(std::min<int64_t>(bits, 1 << 30), -(1 << 30)));
  options.block_size = block_size < 0 ? 0 : static_cast<size_t>(block_size);
  options.op = average ? ReduceOp::kAvg : ReduceOp::kSum;
  size_t total = 0;
  for (const Buffer& b : buffers) total += b.count;
  SyncCallerStreams(tensors);
  Communicator* comm = &comm_;
  // The same on every rank (the topology is): never a rank on each path.
  const bool over_hosts = comm->hierarchical();
  // Kept between calls (they run one at a time, on lane_).
  std::shared_ptr<QuantizedAllreduceScratch> scratch = algorithms_.Get<QuantizedAllreduceScratch>(
      "", [] { return std::make_shared<QuantizedAllreduceScratch>(); });
  std::vector<at::Tensor> outputs = tensors;
  return Submit(
      Lane::kAlgorithms, "gossipcc:quantized_allreduce",
      " (" + std::to_string(total) + " elements, " + std::to_string(bits) + " bits, " + (average ? "avg" : "sum") + ")",
      [this, comm, over_hosts, scratch, buffers, options, feedback, total, keep = tensors,
       keep_residuals = std::make_pair(residual, owned_residual)]() {
        auto reduce = [&](Buffer data) {
          if (over_hosts) {
            HierarchicalQuantizedAllreduce(HostGroupsOnLane(), data, options, feedback, scratch.get());
          } else {
            QuantizedAllreduce(*comm, data, options, feedback, scratch.get());
          }
        };
        const Buffer& first = buffers[0];
        if (buffers.size() == 1 || first.dtype != DType::kFloat32 || first.device.is_cuda()) {
          // One tensor: in place. Several of a dtype or device the collective refuses: it fails on
          // every rank before touching the (then nominal) buffer.
          reduce(Buffer{first.data, total, first.dtype, first.device});
          return;
        }
        std::vector<float> staged(total);
        size_t offset = 0;
        for (const Buffer& b : buffers) {
          if (b.count) std::memcpy(staged.data() + offset, b.data, b.bytes());
          offset += b.count;
        }
        reduce(CpuBuffer(staged.data(), total));
        offset = 0;
        for (const Buffer& b : buffers) {
          if (b.count) std::memcpy(b.data, staged.data() + offset, b.bytes());
          offset += b.count;
        }
      },
      std::move(outputs), /*uses_collectives=*/true);
}

}  // namespace torch_backend
}  // namespace gossipcc
