#include "comm/gloo/float32_packing.h"

#include <algorithm>
#include <cstring>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

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
// The packer stores whole 8-byte words where fewer bytes are meant (the next field overwrites
// the excess), so the output has this much room past the last block.
constexpr size_t kSlackBytes = 8;

// The layout is little-endian, as is the host: integers are stored and loaded as they are in
// memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the packed layout is little-endian");

template <typename T>
void Store(uint8_t* out, T v) {
  std::memcpy(out, &v, sizeof(T));
}
template <typename T>
T Load(const uint8_t* in) {
  T v;
  std::memcpy(&v, in, sizeof(T));
  return v;
}

// Bit j set for each of the m <= 64 values of a block.
uint64_t BlockMask(size_t m) { return m == kBlock ? ~uint64_t{0} : (uint64_t{1} << m) - 1; }

// Bytes of the exponent field of a block of m values at width k.
size_t ExponentBytes(size_t m, unsigned k) { return (m / 8) * k + ((m % 8) * k + 7) / 8; }

void WriteHeader(uint8_t* out, uint32_t format, size_t length, size_t count) {
  Store<uint32_t>(out, kMagic);
  Store<uint32_t>(out + 4, format);
  Store<uint32_t>(out + 8, static_cast<uint32_t>(length));
  Store<uint32_t>(out + 12, static_cast<uint32_t>(count));
}

// What the packer needs to know of a block before writing it.
struct BlockScan {
  uint64_t zeros = 0, negative_zeros = 0;
  uint32_t lo = 255, hi = 0;  // smallest and largest exponent of the non-zero values
  uint8_t exponent[kBlock];
  uint8_t is_zero[kBlock];  // 1 or 0
};

void ScanBlockScalar(const uint32_t* v, size_t m, BlockScan& b) {
  for (size_t j = 0; j < m; ++j) {
    const uint32_t magnitude = v[j] & 0x7fffffffu;
    const bool zero = magnitude == 0;
    const uint32_t e = magnitude >> 23;
    b.zeros |= uint64_t{zero} << j;
    b.negative_zeros |= uint64_t{zero && v[j] != 0} << j;
    b.lo = std::min(b.lo, zero ? 255u : e);
    b.hi = std::max(b.hi, zero ? 0u : e);
    b.exponent[j] = static_cast<uint8_t>(e);
    b.is_zero[j] = zero;
  }
}

#ifdef __SSE2__
// A full block, 16 values at a time: exponents and zero flags narrowed to bytes, the masks
// from the flags' top bits, min and max over bytes. The same results as ScanBlockScalar.
void ScanFullBlock(const uint32_t* v, BlockScan& b) {
  const __m128i abs_mask = _mm_set1_epi32(0x7fffffff);
  const __m128i zero = _mm_setzero_si128();
  __m128i lo = _mm_set1_epi8(static_cast<char>(0xff)), hi = zero;
  for (size_t g = 0; g < kBlock; g += 16) {
    __m128i e32[4], z32[4], nz32[4];
    for (int q = 0; q < 4; ++q) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + g + 4 * q));
      const __m128i magnitude = _mm_and_si128(x, abs_mask);
      e32[q] = _mm_srli_epi32(magnitude, 23);
      z32[q] = _mm_cmpeq_epi32(magnitude, zero);
      nz32[q] = _mm_andnot_si128(_mm_cmpeq_epi32(x, zero), z32[q]);  // zero magnitude, sign set
    }
    // 32-bit lanes (exponents <= 255, flags 0 or -1) to bytes, order kept.
    const __m128i e8 = _mm_packus_epi16(_mm_packs_epi32(e32[0], e32[1]), _mm_packs_epi32(e32[2], e32[3]));
    const __m128i z8 = _mm_packs_epi16(_mm_packs_epi32(z32[0], z32[1]), _mm_packs_epi32(z32[2], z32[3]));
    const __m128i nz8 = _mm_packs_epi16(_mm_packs_epi32(nz32[0], nz32[1]), _mm_packs_epi32(nz32[2], nz32[3]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.exponent + g), e8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.is_zero + g), _mm_and_si128(z8, _mm_set1_epi8(1)));
    b.zeros |= static_cast<uint64_t>(_mm_movemask_epi8(z8)) << g;
    b.negative_zeros |= static_cast<uint64_t>(_mm_movemask_epi8(nz8)) << g;
    lo = _mm_min_epu8(lo, _mm_or_si128(e8, z8));       // zeros count as 255
    hi = _mm_max_epu8(hi, _mm_andnot_si128(z8, e8));   // zeros count as 0
  }
  alignas(16) uint8_t los[16], his[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(los), lo);
  _mm_store_si128(reinterpret_cast<__m128i*>(his), hi);
  b.lo = *std::min_element(los, los + 16);
  b.hi = *std::max_element(his, his + 16);
}
#endif

// Exponent fields: groups of 8 values, each group `W` bytes (the last group of a short
// block fewer), value i of a group in bits [i*W, (i+1)*W). A template per width, so that the
// shifts are constants.
template <unsigned W>
void PutExponents(const uint8_t* delta, size_t m, uint8_t*& p) {
  for (size_t g = 0; g < m; g += 8) {
    uint64_t bits = 0;
    for (unsigned i = 0; i < 8; ++i) bits |= uint64_t{delta[g + i]} << (i * W);
    Store<uint64_t>(p, bits);
    p += (std::min<size_t>(8, m - g) * W + 7) / 8;
  }
}

// Reads what PutExponents<W> wrote, adding `base`; returns the largest exponent decoded
// (above 255 only in a malformed message). The caller checked the field lies inside [p, end).
template <unsigned W>
uint32_t GetExponents(const uint8_t*& p, const uint8_t* end, size_t m, uint32_t base, uint8_t* exponent) {
  constexpr uint64_t kField = (uint64_t{1} << W) - 1;
  uint32_t top = 0;
  for (size_t g = 0; g < m; g += 8) {
    const size_t nbytes = (std::min<size_t>(8, m - g) * W + 7) / 8;
    uint64_t bits = 0;
    if (end - p >= 8) {
      bits = Load<uint64_t>(p);
      if (nbytes < 8) bits &= (uint64_t{1} << (8 * nbytes)) - 1;
    } else {
      for (size_t b = 0; b < nbytes; ++b) bits |= uint64_t{p[b]} << (8 * b);
    }
    p += nbytes;
    for (unsigned i = 0; i < 8; ++i) {
      const uint32_t e = base + static_cast<uint32_t>((bits >> (i * W)) & kField);
      exponent[g + i] = static_cast<uint8_t>(e);
      top = std::max(top, e);
    }
  }
  return top;
}

using PutExponentsFn = void (*)(const uint8_t*, size_t, uint8_t*&);
using GetExponentsFn = uint32_t (*)(const uint8_t*&, const uint8_t*, size_t, uint32_t, uint8_t*);
constexpr PutExponentsFn kPutExponents[9] = {nullptr,          PutExponents<1>, PutExponents<2>,
                                             PutExponents<3>,  PutExponents<4>, PutExponents<5>,
                                             PutExponents<6>,  PutExponents<7>, PutExponents<8>};
constexpr GetExponentsFn kGetExponents[9] = {nullptr,          GetExponents<1>, GetExponents<2>,
                                             GetExponents<3>,  GetExponents<4>, GetExponents<5>,
                                             GetExponents<6>,  GetExponents<7>, GetExponents<8>};

// Sign and mantissa of a value: 24 bits, the sign on top.
inline uint32_t LowBits(uint32_t v) { return (v & 0x7fffffu) | ((v >> 31) << 23); }
inline uint32_t FromParts(uint32_t low, uint32_t exponent) {
  return ((low >> 23) << 31) | (exponent << 23) | (low & 0x7fffffu);
}

#ifdef __SSE2__
// 16 bytes to four vectors of 32-bit lanes, in order.
inline void Widen(__m128i bytes, __m128i out[4]) {
  const __m128i zero = _mm_setzero_si128();
  const __m128i lo = _mm_unpacklo_epi8(bytes, zero), hi = _mm_unpackhi_epi8(bytes, zero);
  out[0] = _mm_unpacklo_epi16(lo, zero);
  out[1] = _mm_unpackhi_epi16(lo, zero);
  out[2] = _mm_unpacklo_epi16(hi, zero);
  out[3] = _mm_unpackhi_epi16(hi, zero);
}
// Four vectors of 32-bit lanes holding bytes (0..255) to 16 bytes, in order.
inline __m128i Narrow(const __m128i in[4]) {
  return _mm_packus_epi16(_mm_packs_epi32(in[0], in[1]), _mm_packs_epi32(in[2], in[3]));
}
#endif

// The three byte planes (bits 0-7, 8-15, 16-23 of LowBits) of a block with no zeros.
void PutPlanesDense(const uint32_t* v, size_t m, uint8_t* p) {
#ifdef __SSE2__
  if (m == kBlock) {
    const __m128i mantissa = _mm_set1_epi32(0x7fffff), byte = _mm_set1_epi32(0xff);
    for (size_t g = 0; g < kBlock; g += 16) {
      __m128i b0[4], b1[4], b2[4];
      for (int q = 0; q < 4; ++q) {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + g + 4 * q));
        const __m128i low = _mm_or_si128(_mm_and_si128(x, mantissa), _mm_slli_epi32(_mm_srli_epi32(x, 31), 23));
        b0[q] = _mm_and_si128(low, byte);
        b1[q] = _mm_and_si128(_mm_srli_epi32(low, 8), byte);
        b2[q] = _mm_srli_epi32(low, 16);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + g), Narrow(b0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + kBlock + g), Narrow(b1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 2 * kBlock + g), Narrow(b2));
    }
    return;
  }
#endif
  for (size_t j = 0; j < m; ++j) {
    const uint32_t low = LowBits(v[j]);
    p[j] = static_cast<uint8_t>(low);
    p[m + j] = static_cast<uint8_t>(low >> 8);
    p[2 * m + j] = static_cast<uint8_t>(low >> 16);
  }
}

void GetPlanesDense(const uint8_t* p, size_t m, const uint8_t* exponent, uint32_t* v) {
#ifdef __SSE2__
  if (m == kBlock) {
    const __m128i low7 = _mm_set1_epi32(0x7f);
    for (size_t g = 0; g < kBlock; g += 16) {
      __m128i b0[4], b1[4], b2[4], e[4];
      Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + g)), b0);
      Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kBlock + g)), b1);
      Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * kBlock + g)), b2);
      Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(exponent + g)), e);
      for (int q = 0; q < 4; ++q) {
        const __m128i sign = _mm_slli_epi32(_mm_srli_epi32(b2[q], 7), 31);
        const __m128i high = _mm_slli_epi32(_mm_and_si128(b2[q], low7), 16);
        const __m128i x = _mm_or_si128(_mm_or_si128(sign, _mm_slli_epi32(e[q], 23)),
                                       _mm_or_si128(high, _mm_or_si128(_mm_slli_epi32(b1[q], 8), b0[q])));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(v + g + 4 * q), x);
      }
    }
    return;
  }
#endif
  for (size_t j = 0; j < m; ++j) {
    const uint32_t low = uint32_t{p[j]} | uint32_t{p[m + j]} << 8 | uint32_t{p[2 * m + j]} << 16;
    v[j] = FromParts(low, exponent[j]);
  }
}

// Packs one block of m <= 64 values at `out`; returns the bytes written.
size_t PackBlock(const uint32_t* v, size_t m, uint8_t* out) {
  BlockScan scan;
#ifdef __SSE2__
  if (m == kBlock) {
    ScanFullBlock(v, scan);
  } else {
    ScanBlockScalar(v, m, scan);
  }
#else
  ScanBlockScalar(v, m, scan);
#endif
  const uint64_t zeros = scan.zeros, negative_zeros = scan.negative_zeros;
  const uint32_t base = zeros == BlockMask(m) ? 0 : scan.lo;
  const unsigned width = scan.hi > base ? static_cast<unsigned>(32 - __builtin_clz(scan.hi - base)) : 0;
  uint8_t* p = out;
  *p++ = static_cast<uint8_t>(width | (zeros ? kHasZeros : 0) | (negative_zeros ? kHasNegativeZeros : 0));
  *p++ = static_cast<uint8_t>(base);
  if (zeros) {
    Store<uint64_t>(p, zeros);
    p += 8;
  }
  if (negative_zeros) {
    Store<uint64_t>(p, negative_zeros);
    p += 8;
  }
  if (width > 0) {
    uint8_t delta[kBlock] = {};
    for (size_t j = 0; j < m; ++j) {
      delta[j] = static_cast<uint8_t>((scan.exponent[j] - base) & (scan.is_zero[j] - 1u));  // zeros: 0
    }
    kPutExponents[width](delta, m, p);
  }
  if (zeros == 0) {
    PutPlanesDense(v, m, p);
    p += 3 * m;
  } else {
    const size_t nonzero = m - static_cast<size_t>(__builtin_popcountll(zeros));
    size_t k = 0;
    for (size_t j = 0; j < m; ++j) {
      if (scan.is_zero[j]) continue;
      const uint32_t low = LowBits(v[j]);
      p[k] = static_cast<uint8_t>(low);
      p[nonzero + k] = static_cast<uint8_t>(low >> 8);
      p[2 * nonzero + k] = static_cast<uint8_t>(low >> 16);
      ++k;
    }
    p += 3 * nonzero;
  }
  return static_cast<size_t>(p - out);
}

absl::Status Malformed(size_t block, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("packed float32 message, block ", block, ": ", what));
}

// The fields of a message's 16-byte header.
struct MessageHeader {
  uint32_t format = 0;
  size_t length = 0;  // of the whole message, header included
  size_t count = 0;   // values
};

// Reads the header of `in`, a message expected to hold `expected` values, and checks what the
// rest of the message is read by: the magic, the count, and a stated length that lies in `in`.
absl::Status ReadMessageHeader(absl::Span<const uint8_t> in, size_t expected, MessageHeader& header) {
  if (in.size() < kPackedFloat32HeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("packed float32 message: ", in.size(),
                                                   " bytes, shorter than its 16-byte header"));
  }
  const uint32_t magic = Load<uint32_t>(in.data());
  header.format = Load<uint32_t>(in.data() + 4);
  header.length = Load<uint32_t>(in.data() + 8);
  header.count = Load<uint32_t>(in.data() + 12);
  if (magic != kMagic) {
    return absl::InvalidArgumentError(absl::StrCat("packed float32 message: bad magic 0x", absl::Hex(magic),
                                                   " (not a packed message)"));
  }
  if (header.count != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed float32 message holds ", header.count, " values, expected ", expected));
  }
  if (header.length < kPackedFloat32HeaderBytes || header.length > in.size()) {
    return absl::InvalidArgumentError(absl::StrCat("packed float32 message states a length of ", header.length,
                                                   " bytes; ", in.size(), " are there"));
  }
  return absl::OkStatus();
}

// A raw message's values, [p, end): exactly 4 bytes for each.
absl::Status UnpackRaw(const uint8_t* p, const uint8_t* end, const MessageHeader& header,
                       absl::Span<uint32_t> values) {
  if (static_cast<size_t>(end - p) != header.count * 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw float32 message of ", header.length, " bytes for ", header.count, " values"));
  }
  if (header.count > 0) std::memcpy(values.data(), p, header.count * 4);
  return absl::OkStatus();
}

// What a block states before its exponents: their width and base, and its zero masks.
struct BlockHeader {
  unsigned width = 0;
  uint32_t base = 0;
  uint64_t zeros = 0;
  uint64_t negative_zeros = 0;
};

// Reads the header of block `block`, of m values, from [p, end) and moves p past it. Checks
// the flags, and that the masks name only zeros among the block's m values.
absl::Status ReadBlockHeader(const uint8_t*& p, const uint8_t* end, size_t block, size_t m, BlockHeader& header) {
  if (end - p < 2) return Malformed(block, "header runs past the message");
  const uint8_t flags = p[0];
  header.width = flags & kWidthMask;
  header.base = p[1];
  p += 2;
  if (header.width > 8 || (flags & ~(kWidthMask | kHasZeros | kHasNegativeZeros)) != 0) {
    return Malformed(block, absl::StrCat("bad flags 0x", absl::Hex(flags)));
  }
  header.zeros = 0;
  header.negative_zeros = 0;
  const size_t mask_bytes = ((flags & kHasZeros) ? 8 : 0) + ((flags & kHasNegativeZeros) ? 8 : 0);
  if (static_cast<size_t>(end - p) < mask_bytes) return Malformed(block, "masks run past the message");
  if (flags & kHasZeros) {
    header.zeros = Load<uint64_t>(p);
    p += 8;
  }
  if (flags & kHasNegativeZeros) {
    header.negative_zeros = Load<uint64_t>(p);
    p += 8;
  }
  if ((header.zeros & ~BlockMask(m)) != 0 || (header.negative_zeros & ~header.zeros) != 0) {
    return Malformed(block, "zero masks name values outside the block or non-zeros");
  }
  return absl::OkStatus();
}

// The m values of a block with zeros: signed zeros from the masks, the others from the byte
// planes of its `nonzero` non-zero values at p and their exponents.
void GetPlanesSparse(const uint8_t* p, size_t m, const BlockHeader& header, size_t nonzero, const uint8_t* exponent,
                     uint32_t* v) {
  for (size_t j = 0, k = 0; j < m; ++j) {
    if ((header.zeros >> j) & 1) {
      v[j] = static_cast<uint32_t>((header.negative_zeros >> j) & 1) << 31;
      continue;
    }
    v[j] = FromParts(uint32_t{p[k]} | uint32_t{p[nonzero + k]} << 8 | uint32_t{p[2 * nonzero + k]} << 16,
                     exponent[j]);
    ++k;
  }
}

// Unpacks block `block`, of m values, from [p, end) into v and moves p past it. Every field
// is checked to lie in [p, end) before it is read.
absl::Status UnpackBlock(const uint8_t*& p, const uint8_t* end, size_t block, size_t m, uint32_t* v) {
  BlockHeader header;
  absl::Status status = ReadBlockHeader(p, end, block, m, header);
  if (!status.ok()) return status;
  const size_t nonzero = m - static_cast<size_t>(__builtin_popcountll(header.zeros));
  const size_t needed = ExponentBytes(m, header.width) + 3 * nonzero;
  if (static_cast<size_t>(end - p) < needed) return Malformed(block, "values run past the message");
  uint8_t exponent[kBlock];
  if (header.width == 0) {
    std::fill(exponent, exponent + kBlock, static_cast<uint8_t>(header.base));
  } else {
    const uint32_t top = kGetExponents[header.width](p, end, m, header.base, exponent);
    if (top > 255) return Malformed(block, absl::StrCat("exponent ", top, " above 255"));
  }
  if (header.zeros == 0) {
    GetPlanesDense(p, m, exponent, v);
  } else {
    GetPlanesSparse(p, m, header, nonzero, exponent, v);
  }
  p += 3 * nonzero;
  return absl::OkStatus();
}

// A packed message's blocks, [p, end), into `values`; the message must end with the last one.
absl::Status UnpackBlocks(const uint8_t* p, const uint8_t* end, absl::Span<uint32_t> values) {
  const size_t count = values.size();
  for (size_t first = 0; first < count; first += kBlock) {
    absl::Status status = UnpackBlock(p, end, first / kBlock, std::min(kBlock, count - first), values.data() + first);
    if (!status.ok()) return status;
  }
  if (p != end) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed float32 message: ", end - p, " bytes left over after its ", count, " values"));
  }
  return absl::OkStatus();
}

}  // namespace

size_t PackedFloat32Bound(size_t count) {
  const size_t blocks = (count + kBlock - 1) / kBlock;
  return kPackedFloat32HeaderBytes + std::max(count * 4, blocks * kMaxBlockBytes) + kSlackBytes;
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

absl::Status UnpackFloat32(absl::Span<const uint8_t> in, absl::Span<uint32_t> values) {
  MessageHeader header;
  absl::Status status = ReadMessageHeader(in, values.size(), header);
  if (!status.ok()) return status;
  const uint8_t* const p = in.data() + kPackedFloat32HeaderBytes;
  const uint8_t* const end = in.data() + header.length;
  if (header.format == kFormatRaw) return UnpackRaw(p, end, header, values);
  if (header.format != kFormatPacked) {
    return absl::InvalidArgumentError(absl::StrCat("packed float32 message: unknown format ", header.format));
  }
  return UnpackBlocks(p, end, values);
}

}  // namespace gossipcc
