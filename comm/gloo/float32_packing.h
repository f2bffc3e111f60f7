// Lossless packing of float32 values for the wire (format: docs/comm.md, "Lossless packing"):
// per block of 64 values a base exponent and k-bit offsets, zero masks, sign and mantissa as
// they are; a message that would not shrink goes raw. Every bit pattern round-trips.
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

// Packs `values` (float32 bit patterns) into `out` (room for PackedFloat32Bound bytes); returns its length.
size_t PackFloat32(absl::Span<const uint32_t> values, uint8_t* out);

// Unpacks a message of PackFloat32 into `values` (sized to its count); `in` may be longer than
// the message. A malformed message is an InvalidArgument naming what is wrong, never a read
// outside `in`; `values` may then hold part of it.
absl::Status UnpackFloat32(absl::Span<const uint8_t> in, absl::Span<uint32_t> values);

}  // namespace gossipcc
