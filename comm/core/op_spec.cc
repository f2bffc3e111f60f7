#include "comm/core/op_spec.h"

#include "absl/strings/str_cat.h"

namespace gossipcc {

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kAllgatherv: return "allgatherv";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kAlltoallv: return "alltoallv";
    case OpKind::kBarrier: return "barrier";
  }
  return "unknown-op";
}

std::string OpSpec::Describe() const {
  std::string s = absl::StrCat(OpKindName(kind), " #", seq);
  if (kind == OpKind::kBarrier) return s;
  absl::StrAppend(&s, " (", count, " x ", DTypeName(dtype), " on ", device.ToString());
  if (has_reduce_op()) absl::StrAppend(&s, ", ", ReduceOpName(op));
  if (kind == OpKind::kBroadcast) absl::StrAppend(&s, ", root ", root);
  absl::StrAppend(&s, ")");
  return s;
}

uint64_t HashCounts(const std::vector<size_t>& counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t c : counts) {
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(c) >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

}  // namespace gossipcc
