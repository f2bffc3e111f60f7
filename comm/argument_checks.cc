#include "comm/argument_checks.h"

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"
#include "comm/core/reduce.h"
#include "comm/nccl/nccl_transport.h"

namespace gossipcc {

std::string ArgumentChecks::Where(const std::string& op) const {
  return absl::StrCat("rank ", rank, " of ", size, ": ", op);
}

void ArgumentChecks::Buffer(const char* op, const char* name, const gossipcc::Buffer& b) const {
  auto invalid = [&](auto&&... why) { throw InvalidArgumentError(absl::StrCat(Where(op), ": ", name, why...)); };
  if (b.data == nullptr && b.count > 0) invalid(" is null but has ", b.count, " elements");
  if (static_cast<int>(b.dtype) < 0 || static_cast<int>(b.dtype) >= kNumDTypes) invalid(" has an invalid dtype");
  if (!b.device.is_cuda()) {
    if (b.device.index != -1) invalid(" is a CPU buffer with device index ", b.device.index);
    return;
  }
  if (b.device.index < 0) invalid(" is on CUDA without a device ordinal");
  const int visible = NcclTransport::DeviceCount();
  if (b.device.index >= visible) {
    invalid(" is on ", b.device.ToString(), " but ", visible, " CUDA device(s) are visible",
            visible == 0 ? " (no GPU, no driver, or built without CUDA)" : "");
  }
  const int bound = cuda_device;
  if (bound >= 0 && b.device.index != bound) {
    invalid(" is on ", b.device.ToString(), " but this communicator uses cuda:", bound);
  }
}

void ArgumentChecks::Same(const char* op, const gossipcc::Buffer& a, const gossipcc::Buffer& b) const {
  if (a.dtype != b.dtype) {
    throw InvalidArgumentError(absl::StrCat(Where(op), ": input is ", DTypeName(a.dtype), " but output is ",
                                            DTypeName(b.dtype)));
  }
  if (a.device != b.device) {
    throw InvalidArgumentError(absl::StrCat(Where(op), ": input is on ", a.device.ToString(), " but output is on ",
                                            b.device.ToString()));
  }
}

void ArgumentChecks::Peer(const char* op, int peer, const char* what) const {
  if (peer < 0 || peer >= size) {
    throw InvalidArgumentError(absl::StrCat(Where(op), ": ", what, " ", peer, " is out of range [0, ", size, ")"));
  }
}

void ArgumentChecks::Counts(const char* op, const char* name, const std::vector<size_t>& counts) const {
  if (counts.size() != static_cast<size_t>(size)) {
    throw InvalidArgumentError(absl::StrCat(Where(op), ": ", name, " has ", counts.size(),
                                            " entries; one per rank (", size, ") is required"));
  }
}

void ArgumentChecks::Reduce(const char* op, const gossipcc::Buffer& b, ReduceOp reduce) const {
  try {
    CheckReduceSupported(b.dtype, reduce);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(absl::StrCat(Where(op), ": ", e.what()));
  }
  if (IsBitwise(reduce) && b.device.is_cuda()) {
    throw InvalidArgumentError(absl::StrCat(Where(op), ": reduce op ", ReduceOpName(reduce),
                                            " is not supported on CUDA buffers (NCCL has no bitwise reductions)"));
  }
}

void ArgumentChecks::Gather(const char* name, const P2POp& op) const {
  if (op.kind != P2POp::Kind::kSend) {
    throw InvalidArgumentError(absl::StrCat(Where(name), ": only a send can gather its message from pieces"));
  }
  size_t total = 0;
  for (size_t i = 0; i < op.gather.size(); ++i) {
    const gossipcc::Buffer& piece = op.gather[i];
    const std::string what = absl::StrCat("gather piece ", i);
    Buffer(name, what.c_str(), piece);
    if (piece.device.is_cuda()) {
      throw InvalidArgumentError(absl::StrCat(Where(name), ": ", what, " is on ", piece.device.ToString(),
                                              "; gathered sends take CPU memory only"));
    }
    if (piece.dtype != op.buffer.dtype) {
      throw InvalidArgumentError(absl::StrCat(Where(name), ": ", what, " is ", DTypeName(piece.dtype),
                                              " but the message is ", DTypeName(op.buffer.dtype)));
    }
    total += piece.count;
  }
  if (total != op.buffer.count || op.buffer.device.is_cuda()) {
    throw InvalidArgumentError(absl::StrCat(Where(name), ": the gather pieces hold ", total,
                                            " elements but the message is ", op.buffer.ToString()));
  }
}

std::string ArgumentChecks::P2P(absl::Span<const P2POp> ops, bool any_source) const {
  const bool cuda = ops[0].buffer.device.is_cuda();
  std::string description = absl::StrCat("p2p batch of ", ops.size(), " on rank ", rank, " of ", size);
  for (const P2POp& op : ops) {
    const char* name = op.kind == P2POp::Kind::kSend ? "send" : "recv";
    auto invalid = [&](auto&&... why) { throw InvalidArgumentError(absl::StrCat(Where(name), ": ", why...)); };
    if (op.gather.empty()) {
      Buffer(name, "buffer", op.buffer);
    } else {
      Gather(name, op);
    }
    if (any_source && op.peer == kAnySource && op.kind == P2POp::Kind::kRecv) {
      if (op.buffer.device.is_cuda()) invalid("receive from any source needs a CPU buffer (NCCL has none)");
      if (size == 1) invalid("receive from any source with no other rank");
    } else {
      Peer(name, op.peer, "peer");
    }
    if (op.peer == rank) invalid("peer ", op.peer, " is this rank itself");
    if (op.buffer.device.is_cuda() != cuda) invalid("a p2p batch mixes CPU and CUDA buffers");
    if (cuda && op.progress) {
      invalid("P2POp::progress is reported for CPU buffers only, not ", op.buffer.device.ToString());
    }
    if (ops.size() == 1) {
      description = absl::StrCat(name, " ", op.buffer.ToString(), op.kind == P2POp::Kind::kSend ? " to" : " from",
                                 op.peer == kAnySource ? " any rank" : absl::StrCat(" rank ", op.peer), " (tag ",
                                 op.tag, ") on rank ", rank, " of ", size);
    }
  }
  return description;
}

}  // namespace gossipcc
