#include "comm/gloo/fingerprint.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/core/errors.h"

namespace gossipcc {
namespace {

std::string DeviceTypeName(uint8_t t) {
  return static_cast<Device::Type>(t) == Device::Type::kCUDA ? "cuda" : "cpu";
}

// Builds "rank 0: a, rank 1: b, ..." from the full table.
template <typename Fn>
std::string Table(const std::vector<Fingerprint>& all, Fn value) {
  std::string s;
  for (size_t r = 0; r < all.size(); ++r) absl::StrAppend(&s, r == 0 ? "" : ", ", "rank ", r, ": ", value(all[r]));
  return s;
}

}  // namespace

Fingerprint Fingerprint::Of(const OpSpec& spec, int peer, size_t payload_bytes) {
  Fingerprint f{};
  f.seq = spec.seq;
  f.count = spec.count;
  f.layout_hash = spec.layout_hash;
  if (spec.kind == OpKind::kAlltoallv) {
    f.sends_to_peer = spec.send_counts[peer];
    f.expects_from_peer = spec.recv_counts[peer];
  }
  f.root = spec.root;
  f.device_index = spec.device.index;
  f.payload_bytes = static_cast<uint32_t>(payload_bytes);
  f.kind = static_cast<uint8_t>(spec.kind);
  f.dtype = static_cast<uint8_t>(spec.dtype);
  f.op = static_cast<uint8_t>(spec.op);
  f.device_type = static_cast<uint8_t>(spec.device.type);
  return f;
}

Fingerprint Fingerprint::Read(const uint8_t* header) {
  Fingerprint f;
  std::memcpy(&f, header, sizeof(f));
  return f;
}

size_t WriteFingerprints(const OpSpec& spec, absl::Span<const uint8_t> payload, int size, uint8_t* out) {
  if (spec.kind == OpKind::kAlltoallv) {
    for (int p = 0; p < size; ++p) {
      Fingerprint f = Fingerprint::Of(spec, p, 0);
      std::memcpy(out + static_cast<size_t>(p) * kFingerprintBytes, &f, sizeof(f));
    }
    return kFingerprintBytes;
  }
  Fingerprint f = Fingerprint::Of(spec, 0, payload.size());
  std::memcpy(out, &f, sizeof(f));
  if (!payload.empty()) std::memcpy(out + kFingerprintBytes, payload.data(), payload.size());
  return kFingerprintBytes + payload.size();
}

void CompareFingerprints(const OpSpec& spec, const std::vector<Fingerprint>& all, const std::string& where) {
  const size_t n = all.size();
  auto differs = [&](auto field) {
    for (size_t p = 0; p < n; ++p)
      if (field(all[p]) != field(all[0])) return true;
    return false;
  };
  auto fail = [&](const std::string& what) {
    throw MismatchError(absl::StrCat(where, ": ranks disagree on ", what, "; no buffer was modified"));
  };
  if (differs([](const Fingerprint& f) { return f.seq; }))
    fail(absl::StrCat("the collective sequence number (did some rank skip or add a collective?): ",
                      Table(all, [](const Fingerprint& f) { return f.seq; })));
  if (differs([](const Fingerprint& f) { return f.kind; }))
    fail(absl::StrCat("the operation: ", Table(all, [](const Fingerprint& f) {
                        return std::string(OpKindName(static_cast<OpKind>(f.kind)));
                      })));
  if (differs([](const Fingerprint& f) { return f.device_type; }))
    fail(absl::StrCat("the device type: ",
                      Table(all, [](const Fingerprint& f) { return DeviceTypeName(f.device_type); })));
  if (spec.kind == OpKind::kBarrier) return;
  if (differs([](const Fingerprint& f) { return f.dtype; }))
    fail(absl::StrCat("the dtype: ", Table(all, [](const Fingerprint& f) {
                        return std::string(DTypeName(static_cast<DType>(f.dtype)));
                      })));
  if (spec.has_reduce_op() && differs([](const Fingerprint& f) { return f.op; }))
    fail(absl::StrCat("the reduce op: ", Table(all, [](const Fingerprint& f) {
                        return std::string(ReduceOpName(static_cast<ReduceOp>(f.op)));
                      })));
  if (spec.kind == OpKind::kBroadcast && differs([](const Fingerprint& f) { return f.root; }))
    fail(absl::StrCat("the root: ", Table(all, [](const Fingerprint& f) { return f.root; })));
  if (spec.kind != OpKind::kAlltoallv && differs([](const Fingerprint& f) { return f.count; })) {
    const char* what = spec.kind == OpKind::kAllgather        ? "the input element count"
                       : spec.kind == OpKind::kReduceScatter  ? "the output element count"
                       : spec.kind == OpKind::kAllgatherv     ? "the total element count"
                       : spec.kind == OpKind::kAlltoall       ? "the input element count"
                                                              : "the element count";
    fail(absl::StrCat(what, ": ", Table(all, [](const Fingerprint& f) { return f.count; })));
  }
  if (spec.kind == OpKind::kAllgatherv && differs([](const Fingerprint& f) { return f.layout_hash; }))
    fail("the per-rank counts vector (every rank must pass the same counts)");
}

PairVerdict PairVerdict::Judge(const OpSpec& spec, int me, const std::vector<Fingerprint>& all) {
  PairVerdict mine{};
  const int n = static_cast<int>(all.size());
  for (int p = 0; p < n && !mine.bad; ++p) {
    if (p == me) continue;
    if (all[p].sends_to_peer != spec.recv_counts[p]) {
      mine = {1, static_cast<uint64_t>(p), static_cast<uint64_t>(me), all[p].sends_to_peer, spec.recv_counts[p]};
    } else if (all[p].expects_from_peer != spec.send_counts[p]) {
      mine = {1, static_cast<uint64_t>(me), static_cast<uint64_t>(p), spec.send_counts[p], all[p].expects_from_peer};
    }
  }
  return mine;
}

void ThrowOnBadPair(const uint8_t* verdicts, int size, const std::string& where) {
  for (int p = 0; p < size; ++p) {
    PairVerdict v;
    std::memcpy(&v, verdicts + static_cast<size_t>(p) * kFingerprintBytes, sizeof(v));
    if (v.bad) {
      throw MismatchError(absl::StrCat(where, ": rank ", v.sender, " sends ", v.sends, " elements to rank ", v.receiver,
                                       " but rank ", v.receiver, " expects ", v.expects, "; no buffer was modified"));
    }
  }
}

}  // namespace gossipcc
