#include "compression/quantized_blocks.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace gossipcc {
namespace quantized_internal {
namespace {

// Blocks whose maximum is below this are sent as zeros: their scale M / Q and 1 / scale then
// stay normal floats (no subnormal or infinite intermediate), so the relative error analysis of
// the header holds for every other block.
constexpr float kTinyBlockMax = 0x1p-100f;
// Adding and subtracting 1.5 * 2^23 rounds a float of magnitude below 2^22 to an integer, to
// nearest with ties to even (the default rounding mode), in two vectorisable additions.
constexpr float kRoundMagic = 12582912.0f;

}  // namespace

int LevelsOf(int bits) { return (1 << (bits - 1)) - 1; }

size_t CodeBytes(size_t count, int bits) { return bits == 8 ? count : (count + 1) / 2; }

size_t FullBlockBytes(int bits, size_t block_size) { return 4 + CodeBytes(block_size, bits); }

size_t BlockCount(size_t count, size_t block_size) { return count == 0 ? 0 : (count - 1) / block_size + 1; }

// Byte offset of block b in the quantized buffer (b may equal the block count: the end).
size_t BlockOffset(size_t b, size_t count, int bits, size_t block_size) {
  const size_t blocks = BlockCount(count, block_size);
  if (b < blocks) return b * FullBlockBytes(bits, block_size);
  return EncodedBytes(count, bits, block_size);
}

size_t EncodedBytes(size_t count, int bits, size_t block_size) {
  const size_t blocks = BlockCount(count, block_size);
  if (blocks == 0) return 0;
  const size_t last = count - (blocks - 1) * block_size;
  return (blocks - 1) * FullBlockBytes(bits, block_size) + 4 + CodeBytes(last, bits);
}

namespace {

void QuantizeValues(const float* v, size_t count, int bits, uint8_t* out, float* residual_out) {
  const int levels = LevelsOf(bits);
  // The largest |x| as the largest magnitude bit pattern: for non-negative floats the integer
  // order is the numeric order, and NaN patterns lie above infinity's, so one integer maximum
  // (which vectorises) gives both the block maximum and whether the block is finite.
  int32_t max_bits = 0;
  for (size_t i = 0; i < count; ++i) {
    int32_t b;
    std::memcpy(&b, v + i, 4);
    b &= 0x7FFFFFFF;
    max_bits = b > max_bits ? b : max_bits;
  }
  const bool finite = max_bits < 0x7F800000;
  float max_abs;
  std::memcpy(&max_abs, &max_bits, 4);
  uint8_t* codes = out + 4;
  const size_t code_bytes = CodeBytes(count, bits);
  if (!finite || max_abs < kTinyBlockMax) {
    const float scale = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    std::memcpy(out, &scale, 4);
    std::memset(codes, 0, code_bytes);
    if (residual_out) {
      // A zero block keeps its (tiny) values as the residual; a non-finite one starts afresh.
      for (size_t i = 0; i < count; ++i) residual_out[i] = finite ? v[i] : 0.0f;
    }
    return;
  }
  const float scale = max_abs / static_cast<float>(levels);
  const float inverse = static_cast<float>(levels) / max_abs;
  std::memcpy(out, &scale, 4);
  const float lo = -static_cast<float>(levels), hi = static_cast<float>(levels);
  // 8 bits: the codes themselves; 4 bits: staged, then packed two per byte.
  thread_local std::vector<int8_t> staged;
  int8_t* q = reinterpret_cast<int8_t*>(codes);
  if (bits == 4) {
    if (staged.size() < count + 1) staged.resize(count + 1);
    q = staged.data();
    q[count] = 0;  // the pad nibble of an odd count
  }
  for (size_t i = 0; i < count; ++i) {
    float r = (v[i] * inverse + kRoundMagic) - kRoundMagic;
    r = r < lo ? lo : (r > hi ? hi : r);
    q[i] = static_cast<int8_t>(static_cast<int32_t>(r));
  }
  if (residual_out) {
    for (size_t i = 0; i < count; ++i) residual_out[i] = v[i] - scale * static_cast<float>(q[i]);
  }
  if (bits == 4) {
    // Two's complement nibbles, element 2k in the low nibble of byte k.
    for (size_t k = 0; k < code_bytes; ++k) {
      codes[k] = static_cast<uint8_t>((q[2 * k] & 0xF) | ((q[2 * k + 1] & 0xF) << 4));
    }
  }
}

template <bool kAdd>
inline void Put(float* out, size_t i, float value) {
  if (kAdd) {
    out[i] += value;
  } else {
    out[i] = value;
  }
}

template <bool kAdd>
void Dequantize(const uint8_t* in, size_t count, int bits, float* out) {
  float scale;
  std::memcpy(&scale, in, 4);
  const uint8_t* codes = in + 4;
  if (bits == 8) {
    const auto* q = reinterpret_cast<const int8_t*>(codes);
    for (size_t i = 0; i < count; ++i) Put<kAdd>(out, i, scale * static_cast<float>(q[i]));
    return;
  }
  const size_t pairs = count / 2;
  for (size_t k = 0; k < pairs; ++k) {
    const uint8_t byte = codes[k];
    const int low = static_cast<int8_t>(static_cast<uint8_t>(byte << 4)) >> 4;  // sign-extended nibbles
    const int high = static_cast<int8_t>(byte) >> 4;
    Put<kAdd>(out, 2 * k, scale * static_cast<float>(low));
    Put<kAdd>(out, 2 * k + 1, scale * static_cast<float>(high));
  }
  if (count % 2) {
    const int low = static_cast<int8_t>(static_cast<uint8_t>(codes[pairs] << 4)) >> 4;
    Put<kAdd>(out, count - 1, scale * static_cast<float>(low));
  }
}

}  // namespace

// Quantizes x (+ residual_in, when set) block by block into `out`; the new residual goes to
// residual_out (when set). count elements, blocks of block_size.
void QuantizeRange(const float* x, const float* residual_in, float* residual_out, size_t count, int bits,
                   size_t block_size, uint8_t* out) {
  std::vector<float> staged(residual_in ? std::min(count, block_size) : 0);
  for (size_t start = 0; start < count; start += block_size) {
    const size_t len = std::min(block_size, count - start);
    const float* values = x + start;
    if (residual_in) {
      for (size_t i = 0; i < len; ++i) staged[i] = x[start + i] + residual_in[start + i];
      values = staged.data();
    }
    QuantizeValues(values, len, bits, out, residual_out ? residual_out + start : nullptr);
    out += 4 + CodeBytes(len, bits);
  }
}

void DequantizeRange(const uint8_t* in, size_t count, int bits, size_t block_size, float* out, bool add) {
  for (size_t start = 0; start < count; start += block_size) {
    const size_t len = std::min(block_size, count - start);
    if (add) {
      Dequantize<true>(in, len, bits, out + start);
    } else {
      Dequantize<false>(in, len, bits, out + start);
    }
    in += 4 + CodeBytes(len, bits);
  }
}

void QuantizeBlock(const float* x, size_t count, int bits, uint8_t* out, float* residual) {
  // One block: QuantizeRange stages x + residual before it overwrites residual.
  QuantizeRange(x, residual, residual, count, bits, std::max<size_t>(count, 1), out);
}
void DequantizeBlock(const uint8_t* in, size_t count, int bits, float* out) { Dequantize<false>(in, count, bits, out); }
void DequantizeAddBlock(const uint8_t* in, size_t count, int bits, float* acc) { Dequantize<true>(in, count, bits, acc); }

}  // namespace quantized_internal
}  // namespace gossipcc
