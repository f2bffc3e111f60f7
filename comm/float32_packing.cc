#include "comm/float32_packing.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gossipcc {
namespace {

constexpr uint32_t kMagic = 0x46504347;  // "GCPF"
constexpr uint32_t kFormatRaw = 0;
constexpr uint32_t kFormatPacked = 1;
constexpr uint8_t kWidthMask = 0x0f;
constexpr uint8_t kHasZeros = 0x10;
constexpr uint8_t kHasNegativeZeros = 0x20;
constexpr size_t kBlock = kPackedFloat32BlockValues;
// Block header, two masks, 8-bit exponents, 3 bytes per value.
constexpr size_t kMaxBlockBytes = 2 + 16 + kBlock + 3 * kBlock;

void StoreU32(uint8_t* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t LoadU32(const uint8_t* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{in[i]} << (8 * i);
  return v;
}
void StoreU64(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t LoadU64(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{in[i]} << (8 * i);
  return v;
}

// Bytes of the exponent field of a block of m values at width k.
size_t ExponentBytes(size_t m, unsigned k) { return (m / 8) * k + ((m % 8) * k + 7) / 8; }

void WriteHeader(uint8_t* out, uint32_t format, size_t length, size_t count) {
  StoreU32(out, kMagic);
  StoreU32(out + 4, format);
  StoreU32(out + 8, static_cast<uint32_t>(length));
  StoreU32(out + 12, static_cast<uint32_t>(count));
}

// Packs one block of m <= 64 values at `out`; returns the bytes written.
size_t PackBlock(const uint32_t* v, size_t m, uint8_t* out) {
  uint64_t zeros = 0, negative_zeros = 0;
  uint32_t lo = 255, hi = 0;
  uint8_t exponent[kBlock];
  for (size_t j = 0; j < m; ++j) {
    const uint32_t magnitude = v[j] & 0x7fffffffu;
    const bool zero = magnitude == 0;
    const uint32_t e = magnitude >> 23;
    zeros |= uint64_t{zero} << j;
    negative_zeros |= uint64_t{zero && v[j] != 0} << j;
    lo = std::min(lo, zero ? 255u : e);
    hi = std::max(hi, zero ? 0u : e);
    exponent[j] = static_cast<uint8_t>(e);
  }
  const uint32_t base = zeros == (m == kBlock ? ~uint64_t{0} : (uint64_t{1} << m) - 1) ? 0 : lo;
  const unsigned width = hi > base ? static_cast<unsigned>(32 - __builtin_clz(hi - base)) : 0;
  uint8_t* p = out;
  *p++ = static_cast<uint8_t>(width | (zeros ? kHasZeros : 0) | (negative_zeros ? kHasNegativeZeros : 0));
  *p++ = static_cast<uint8_t>(base);
  if (zeros) {
    StoreU64(p, zeros);
    p += 8;
  }
  if (negative_zeros) {
    StoreU64(p, negative_zeros);
    p += 8;
  }
  if (width > 0) {
    // Groups of 8 values fill exactly `width` bytes.
    for (size_t g = 0; g < m; g += 8) {
      const size_t in_group = std::min<size_t>(8, m - g);
      uint64_t bits = 0;
      for (size_t i = 0; i < in_group; ++i) {
        const uint32_t delta = ((zeros >> (g + i)) & 1) ? 0 : exponent[g + i] - base;
        bits |= uint64_t{delta} << (i * width);
      }
      const size_t nbytes = (in_group * width + 7) / 8;
      for (size_t b = 0; b < nbytes; ++b) p[b] = static_cast<uint8_t>(bits >> (8 * b));
      p += nbytes;
    }
  }
  for (size_t j = 0; j < m; ++j) {
    if ((zeros >> j) & 1) continue;
    const uint32_t low = (v[j] & 0x7fffffu) | ((v[j] >> 31) << 23);
    p[0] = static_cast<uint8_t>(low);
    p[1] = static_cast<uint8_t>(low >> 8);
    p[2] = static_cast<uint8_t>(low >> 16);
    p += 3;
  }
  return static_cast<size_t>(p - out);
}

absl::Status Malformed(size_t block, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("packed float32 message, block ", block, ": ", what));
}

}  // namespace

size_t PackedFloat32Bound(size_t count) {
  const size_t blocks = (count + kBlock - 1) / kBlock;
  return kPackedFloat32HeaderBytes + std::max(count * 4, blocks * kMaxBlockBytes);
}

size_t PackFloat32(absl::Span<const uint32_t> values, uint8_t* out) {
  const size_t count = values.size();
  const size_t raw_bytes = kPackedFloat32HeaderBytes + count * 4;
  size_t length = kPackedFloat32HeaderBytes;
  for (size_t first = 0; first < count; first += kBlock) {
    length += PackBlock(values.data() + first, std::min(kBlock, count - first), out + length);
  }
  if (length >= raw_bytes) {
    // Nothing to gain (values spread over the whole exponent range): store them as they are.
    if (count > 0) std::memcpy(out + kPackedFloat32HeaderBytes, values.data(), count * 4);
    WriteHeader(out, kFormatRaw, raw_bytes, count);
    return raw_bytes;
  }
  WriteHeader(out, kFormatPacked, length, count);
  return length;
}

size_t PackedFloat32MessageBytes(absl::Span<const uint8_t> in) {
  if (in.size() < kPackedFloat32HeaderBytes || LoadU32(in.data()) != kMagic) return 0;
  return LoadU32(in.data() + 8);
}

absl::Status UnpackFloat32(absl::Span<const uint8_t> in, absl::Span<uint32_t> values) {
  if (in.size() < kPackedFloat32HeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("packed float32 message: ", in.size(),
                                                   " bytes, shorter than its 16-byte header"));
  }
  const uint32_t magic = LoadU32(in.data());
  const uint32_t format = LoadU32(in.data() + 4);
  const size_t length = LoadU32(in.data() + 8);
  const size_t count = LoadU32(in.data() + 12);
  if (magic != kMagic) {
    return absl::InvalidArgumentError(absl::StrCat("packed float32 message: bad magic 0x", absl::Hex(magic),
                                                   " (not a packed message)"));
  }
  if (count != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed float32 message holds ", count, " values, expected ", values.size()));
  }
  if (length < kPackedFloat32HeaderBytes || length > in.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed float32 message states a length of ", length, " bytes; ", in.size(), " are there"));
  }
  const uint8_t* p = in.data() + kPackedFloat32HeaderBytes;
  const uint8_t* const end = in.data() + length;
  if (format == kFormatRaw) {
    if (static_cast<size_t>(end - p) != count * 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("raw float32 message of ", length, " bytes for ", count, " values"));
    }
    if (count > 0) std::memcpy(values.data(), p, count * 4);
    return absl::OkStatus();
  }
  if (format != kFormatPacked) {
    return absl::InvalidArgumentError(absl::StrCat("packed float32 message: unknown format ", format));
  }
  uint32_t* v = values.data();
  for (size_t first = 0; first < count; first += kBlock) {
    const size_t block = first / kBlock;
    const size_t m = std::min(kBlock, count - first);
    if (end - p < 2) return Malformed(block, "header runs past the message");
    const uint8_t flags = p[0];
    const unsigned width = flags & kWidthMask;
    const uint32_t base = p[1];
    p += 2;
    if (width > 8 || (flags & ~(kWidthMask | kHasZeros | kHasNegativeZeros)) != 0) {
      return Malformed(block, absl::StrCat("bad flags 0x", absl::Hex(flags)));
    }
    const uint64_t in_block = m == kBlock ? ~uint64_t{0} : (uint64_t{1} << m) - 1;
    uint64_t zeros = 0, negative_zeros = 0;
    const size_t mask_bytes = ((flags & kHasZeros) ? 8 : 0) + ((flags & kHasNegativeZeros) ? 8 : 0);
    if (static_cast<size_t>(end - p) < mask_bytes) return Malformed(block, "masks run past the message");
    if (flags & kHasZeros) {
      zeros = LoadU64(p);
      p += 8;
    }
    if (flags & kHasNegativeZeros) {
      negative_zeros = LoadU64(p);
      p += 8;
    }
    if ((zeros & ~in_block) != 0 || (negative_zeros & ~zeros) != 0) {
      return Malformed(block, "zero masks name values outside the block or non-zeros");
    }
    const size_t nonzero = m - static_cast<size_t>(__builtin_popcountll(zeros));
    const size_t needed = ExponentBytes(m, width) + 3 * nonzero;
    if (static_cast<size_t>(end - p) < needed) return Malformed(block, "values run past the message");
    uint8_t exponent[kBlock];
    if (width == 0) {
      std::fill(exponent, exponent + m, static_cast<uint8_t>(base));
    } else {
      const uint64_t field = (uint64_t{1} << width) - 1;
      for (size_t g = 0; g < m; g += 8) {
        const size_t in_group = std::min<size_t>(8, m - g);
        const size_t nbytes = (in_group * width + 7) / 8;
        uint64_t bits = 0;
        for (size_t b = 0; b < nbytes; ++b) bits |= uint64_t{p[b]} << (8 * b);
        p += nbytes;
        for (size_t i = 0; i < in_group; ++i) {
          const uint32_t e = base + static_cast<uint32_t>((bits >> (i * width)) & field);
          if (e > 255) return Malformed(block, absl::StrCat("exponent ", e, " above 255"));
          exponent[g + i] = static_cast<uint8_t>(e);
        }
      }
    }
    for (size_t j = 0; j < m; ++j) {
      if ((zeros >> j) & 1) {
        v[first + j] = static_cast<uint32_t>((negative_zeros >> j) & 1) << 31;
        continue;
      }
      const uint32_t low = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16;
      p += 3;
      v[first + j] = ((low >> 23) << 31) | (uint32_t{exponent[j]} << 23) | (low & 0x7fffffu);
    }
  }
  if (p != end) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed float32 message: ", end - p, " bytes left over after its ", count, " values"));
  }
  return absl::OkStatus();
}

}  // namespace gossipcc
