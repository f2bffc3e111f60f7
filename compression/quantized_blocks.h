// The quantized all-reduce's block codec (docs/comm.md, "Quantized all-reduce"): per block a
// float32 scale M / Q and one code round(x / scale) in [-Q, Q] per value, as bytes (8 bits) or
// nibbles, low nibble first (4 bits); tiny blocks as zeros, non-finite ones as a NaN scale.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gossipcc {
namespace quantized_internal {

int LevelsOf(int bits);  // Q for `bits`: 127 or 7
// Bytes of the codes of `count` values.
size_t CodeBytes(size_t count, int bits);
// Bytes of a full block: the scale and its codes.
size_t FullBlockBytes(int bits, size_t block_size);
size_t BlockCount(size_t count, size_t block_size);
// Byte offset of block b in the encoding of `count` values (b may be the block count: the end).
size_t BlockOffset(size_t b, size_t count, int bits, size_t block_size);
// Bytes of the whole encoding (QuantizedBytes of quantized_allreduce.h).
size_t EncodedBytes(size_t count, int bits, size_t block_size);

// Encodes x (+ residual_in) into `out`; residual_out (when set) <- (x + residual_in) - decoded.
void QuantizeRange(const float* x, const float* residual_in, float* residual_out, size_t count, int bits,
                   size_t block_size, uint8_t* out);

// Decodes QuantizeRange's layout into `out`, or adds to it (float32) when `add`.
void DequantizeRange(const uint8_t* in, size_t count, int bits, size_t block_size, float* out, bool add);

// One block into `out`; with `residual`, of x + residual, keeping (x + residual) - decoded there.
void QuantizeBlock(const float* x, size_t count, int bits, uint8_t* out, float* residual);
// out[i] = the block's value i (a NaN scale gives NaN everywhere).
void DequantizeBlock(const uint8_t* in, size_t count, int bits, float* out);
// acc[i] += the block's value i (float32 addition).
void DequantizeAddBlock(const uint8_t* in, size_t count, int bits, float* acc);

}  // namespace quantized_internal
}  // namespace gossipcc
