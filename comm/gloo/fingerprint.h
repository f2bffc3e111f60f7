// A collective's fingerprint: the 64-byte header every rank sends to every peer before a
// collective (consistency_check.h moves them, an eager payload after the header), and the
// comparison of every rank's header. Only encoding and comparing here, no transport: on a
// disagreement the comparison throws the same MismatchError on every rank (each holds the same
// table), naming the first field the ranks disagree on and each rank's value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "comm/core/op_spec.h"

namespace gossipcc {

constexpr size_t kFingerprintBytes = 64;

struct Fingerprint {
  uint64_t seq;
  uint64_t count;
  uint64_t layout_hash;
  uint64_t sends_to_peer;      // alltoallv: elements the sender sends to the receiver
  uint64_t expects_from_peer;  // alltoallv: elements the sender expects from the receiver
  int32_t root;
  int32_t device_index;
  uint32_t payload_bytes;
  uint8_t kind;
  uint8_t dtype;
  uint8_t op;
  uint8_t device_type;
  uint64_t reserved;

  // `spec`'s fingerprint as sent to `peer` (only alltoallv's differ per peer), announcing
  // `payload_bytes` of eager payload after it.
  static Fingerprint Of(const OpSpec& spec, int peer, size_t payload_bytes);
  static Fingerprint Read(const uint8_t* header);  // from a header as received
};
static_assert(sizeof(Fingerprint) == kFingerprintBytes, "fingerprint layout");

// Writes what this rank sends for `spec` into `out`: its header followed by `payload`, or, for
// alltoallv (no payload), one header per peer, peer p's at p * kFingerprintBytes. `out` has
// room for max(size * kFingerprintBytes, kFingerprintBytes + payload.size()). Returns the
// bytes each peer is sent (from offset 0, or p * kFingerprintBytes for alltoallv).
size_t WriteFingerprints(const OpSpec& spec, absl::Span<const uint8_t> payload, int size, uint8_t* out);

// Compares every rank's fingerprint (`all`, indexed by rank) of collective `spec` and throws
// MismatchError (starting with `where`, "allreduce #3 on rank 1 of 4") on the first field they
// disagree on. For alltoallv the per-pair counts are not compared here: see PairVerdict.
void CompareFingerprints(const OpSpec& spec, const std::vector<Fingerprint>& all, const std::string& where);

// alltoallv: each pair's counts are checked by the two ranks involved; a second exchange
// tells every rank about any bad pair (ThrowOnBadPair), so all ranks fail together instead of
// the others waiting for data that will never come.
struct PairVerdict {
  uint64_t bad;
  uint64_t sender;
  uint64_t receiver;
  uint64_t sends;
  uint64_t expects;

  // Rank `me`'s verdict on its pairs, from every rank's fingerprint sent to `me`.
  static PairVerdict Judge(const OpSpec& spec, int me, const std::vector<Fingerprint>& all);
};
static_assert(sizeof(PairVerdict) <= kFingerprintBytes, "a verdict travels in a header slot");

// Throws MismatchError naming the first bad pair among `size` verdicts, rank p's at
// p * kFingerprintBytes of `verdicts`.
void ThrowOnBadPair(const uint8_t* verdicts, int size, const std::string& where);

}  // namespace gossipcc
