#include "compression/quantized_check.h"

#include <sstream>
#include <string>
#include <utility>

#include "comm/core/errors.h"

namespace gossipcc {
namespace quantized_internal {
namespace {

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

}  // namespace

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
}  // namespace gossipcc
