#include "comm/consistency_check.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/errors.h"
#include "comm/gloo_util.h"

namespace gossipcc {
namespace {

struct Fingerprint {
  uint64_t seq;
  uint64_t count;
  uint64_t layout_hash;
  uint64_t sends_to_peer;      // alltoallv: elements the sender sends to the receiver
  uint64_t expects_from_peer;  // alltoallv: elements the sender expects from the receiver
  int32_t root;
  int32_t device_index;
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t device_type;
  uint32_t pad;
};
static_assert(sizeof(Fingerprint) == 56, "fingerprint layout");

Fingerprint Make(const OpSpec& spec, int peer) {
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
  f.kind = static_cast<uint8_t>(spec.kind);
  f.dtype = static_cast<uint8_t>(spec.dtype);
  f.op = static_cast<uint8_t>(spec.op);
  f.device_type = static_cast<uint8_t>(spec.device.type);
  return f;
}

std::string DeviceTypeName(uint8_t t) {
  return static_cast<Device::Type>(t) == Device::Type::kCUDA ? "cuda" : "cpu";
}

// Builds "<field> differs across ranks: rank 0: a, rank 1: b, ..." from the full table.
template <typename Fn>
std::string Table(const std::vector<Fingerprint>& all, Fn value) {
  std::string s;
  for (size_t r = 0; r < all.size(); ++r) absl::StrAppend(&s, r == 0 ? "" : ", ", "rank ", r, ": ", value(all[r]));
  return s;
}

// Sends outgoing[p] to every peer p and receives incoming[p] from it (one message latency).
template <typename T>
void ExchangeWithAll(gloo::Context& context, uint64_t slot, std::vector<T>& outgoing, std::vector<T>& incoming,
                     const OpSpec& spec, std::chrono::milliseconds timeout) {
  const int n = context.size;
  const int me = context.rank;
  incoming[me] = outgoing[me];
  try {
    auto in = context.createUnboundBuffer(incoming.data(), incoming.size() * sizeof(T));
    auto out = context.createUnboundBuffer(outgoing.data(), outgoing.size() * sizeof(T));
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      in->recv(p, slot, p * sizeof(T), sizeof(T));
      out->send(p, slot, p * sizeof(T), sizeof(T));
    }
    for (int p = 0; p < n - 1; ++p) {
      in->waitRecv(timeout);
      out->waitSend(timeout);
    }
  } catch (const std::exception& e) {
    RethrowGlooError(absl::StrCat(spec.Describe(), " on rank ", me, " of ", n, ": exchanging signatures"), e);
  }
}

// alltoallv: each pair's counts are checked by the two ranks involved; a second exchange
// tells every rank about any bad pair, so all ranks fail together instead of the others
// waiting for data that will never come.
struct PairVerdict {
  uint64_t bad;
  uint64_t sender;
  uint64_t receiver;
  uint64_t sends;
  uint64_t expects;
};

}  // namespace

void VerifyAcrossRanks(gloo::Context& context, const OpSpec& spec, std::chrono::milliseconds timeout) {
  const int n = context.size;
  const int me = context.rank;
  if (n == 1) return;
  std::vector<Fingerprint> outgoing(n), incoming(n);
  for (int p = 0; p < n; ++p) outgoing[p] = Make(spec, p);
  ExchangeWithAll(context, MakeSlot(kFingerprintSlotPrefix, static_cast<uint32_t>(spec.seq)), outgoing, incoming,
                  spec, timeout);

  const std::string where = absl::StrCat(spec.Describe(), " on rank ", me, " of ", n);
  auto differs = [&](auto field) {
    for (int p = 0; p < n; ++p)
      if (field(incoming[p]) != field(incoming[0])) return true;
    return false;
  };
  auto fail = [&](const std::string& what) {
    throw MismatchError(absl::StrCat(where, ": ranks disagree on ", what, "; no data was exchanged"));
  };
  if (differs([](const Fingerprint& f) { return f.seq; }))
    fail(absl::StrCat("the collective sequence number (did some rank skip or add a collective?): ",
                      Table(incoming, [](const Fingerprint& f) { return f.seq; })));
  if (differs([](const Fingerprint& f) { return f.kind; }))
    fail(absl::StrCat("the operation: ", Table(incoming, [](const Fingerprint& f) {
                        return std::string(OpKindName(static_cast<OpKind>(f.kind)));
                      })));
  if (differs([](const Fingerprint& f) { return f.device_type; }))
    fail(absl::StrCat("the device type: ",
                      Table(incoming, [](const Fingerprint& f) { return DeviceTypeName(f.device_type); })));
  if (spec.kind == OpKind::kBarrier) return;
  if (differs([](const Fingerprint& f) { return f.dtype; }))
    fail(absl::StrCat("the dtype: ", Table(incoming, [](const Fingerprint& f) {
                        return std::string(DTypeName(static_cast<DType>(f.dtype)));
                      })));
  if (spec.has_reduce_op() && differs([](const Fingerprint& f) { return f.op; }))
    fail(absl::StrCat("the reduce op: ", Table(incoming, [](const Fingerprint& f) {
                        return std::string(ReduceOpName(static_cast<ReduceOp>(f.op)));
                      })));
  if (spec.kind == OpKind::kBroadcast && differs([](const Fingerprint& f) { return f.root; }))
    fail(absl::StrCat("the root: ", Table(incoming, [](const Fingerprint& f) { return f.root; })));
  if (spec.kind != OpKind::kAlltoallv && differs([](const Fingerprint& f) { return f.count; })) {
    const char* what = spec.kind == OpKind::kAllgather        ? "the input element count"
                       : spec.kind == OpKind::kReduceScatter  ? "the output element count"
                       : spec.kind == OpKind::kAllgatherv     ? "the total element count"
                       : spec.kind == OpKind::kAlltoall       ? "the input element count"
                                                              : "the element count";
    fail(absl::StrCat(what, ": ", Table(incoming, [](const Fingerprint& f) { return f.count; })));
  }
  if (spec.kind == OpKind::kAllgatherv && differs([](const Fingerprint& f) { return f.layout_hash; }))
    fail("the per-rank counts vector (every rank must pass the same counts)");
  if (spec.kind == OpKind::kAlltoallv) {
    PairVerdict mine{};
    for (int p = 0; p < n && !mine.bad; ++p) {
      if (p == me) continue;
      if (incoming[p].sends_to_peer != spec.recv_counts[p]) {
        mine = {1, static_cast<uint64_t>(p), static_cast<uint64_t>(me), incoming[p].sends_to_peer, spec.recv_counts[p]};
      } else if (incoming[p].expects_from_peer != spec.send_counts[p]) {
        mine = {1, static_cast<uint64_t>(me), static_cast<uint64_t>(p), spec.send_counts[p],
                incoming[p].expects_from_peer};
      }
    }
    std::vector<PairVerdict> verdicts_out(n, mine), verdicts_in(n);
    ExchangeWithAll(context, MakeSlot(kVerdictSlotPrefix, static_cast<uint32_t>(spec.seq)), verdicts_out,
                    verdicts_in, spec, timeout);
    for (const PairVerdict& v : verdicts_in) {
      if (v.bad) {
        throw MismatchError(absl::StrCat(where, ": rank ", v.sender, " sends ", v.sends, " elements to rank ",
                                         v.receiver, " but rank ", v.receiver, " expects ", v.expects,
                                         "; no data was exchanged"));
      }
    }
  }
}

}  // namespace gossipcc
