// Lossless packing of float32 values for the wire: fewer bytes, the same bits back.
//
// Gradients and their partial sums spend most of their 8 exponent bits on a narrow range:
// within a run of 64 values the exponents typically span 8-32 binades, so 3-5 bits tell them
// apart, and ReLU networks leave many exact zeros. PackFloat32 cuts the values into blocks of
// 64 and stores per block the smallest exponent and each value's exponent above it in as few
// bits as the block needs; exact zeros are a bit mask and take no other room; sign and
// mantissa (24 bits) are stored as they are. Nothing compressible: raw size + 16 bytes (the
// packer falls back to storing the values raw); sizes on gradients: see
// docs/benchmarks.md#a-exact-all-reduce-backendgossipcc-vs-backendgloo. Every bit pattern round-trips exactly (NaNs,
// infinities, subnormals, -0.0), so an all-reduce that packs its messages returns the same
// bits as one that does not.
//
// Message layout (all integers little-endian):
//   header (16 bytes): magic "GCPF", format (1 packed, 0 raw), total length in bytes, value count
//   raw: count x 4 bytes
//   packed, per block of m = min(64, remaining) values:
//     byte 0: exponent width k (0..8) | 0x10 zero mask follows | 0x20 negative-zero mask follows
//     byte 1: base exponent (the smallest exponent of the block's non-zero values)
//     [8 bytes: bit j set = value j is +-0]  [8 bytes: bit j set = value j is -0]
//     exponent - base of each value (0 for zeros), k bits each, in groups of 8 values per k
//     bytes: floor(m/8) * k + ceil((m % 8) * k / 8) bytes
//     3 bytes per non-zero value: mantissa | sign << 23
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace gossipcc {

inline constexpr size_t kPackedFloat32HeaderBytes = 16;
inline constexpr size_t kPackedFloat32BlockValues = 64;

// The most bytes PackFloat32 writes for `count` values.
size_t PackedFloat32Bound(size_t count);

// Packs `values` (float32 bit patterns) into `out`, which has room for
// PackedFloat32Bound(values.size()) bytes; returns the bytes written.
size_t PackFloat32(absl::Span<const uint32_t> values, uint8_t* out);

// Unpacks a message PackFloat32 wrote into `values`, whose size must be the packed count.
// `in` may be longer than the message (a receive slot); the message's own length must fit in
// it. Anything else (a bad header, a count other than values.size(), a block that runs past the
// message or decodes an exponent above 255, bytes left over) is an InvalidArgument naming
// what; `values` may then hold part of the message.
absl::Status UnpackFloat32(absl::Span<const uint8_t> in, absl::Span<uint32_t> values);

}  // namespace gossipcc
