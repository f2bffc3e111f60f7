// The block format of the quantized all-reduce (comm/quantized_allreduce.h): `count` floats in
// blocks of `block_size`; each block is a float32 scale M / Q (M the block's largest |value|,
// Q = 2^(bits-1) - 1 levels) followed by one signed code per value, round(value / scale) in
// [-Q, Q], as bytes (8 bits) or two's-complement nibbles, element 2k in the low nibble of byte
// k (4 bits). A block whose maximum is below 2^-100 is sent as zeros; a non-finite block as a
// NaN scale (it decodes to NaN everywhere). The codec only: no communication, no torch.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gossipcc {
namespace quantized_internal {

// Q for `bits` (127 or 7).
int LevelsOf(int bits);
// Bytes of the codes of `count` values.
size_t CodeBytes(size_t count, int bits);
// Bytes of a full block: the scale and its codes.
size_t FullBlockBytes(int bits, size_t block_size);
size_t BlockCount(size_t count, size_t block_size);
// Byte offset of block b in the encoding of `count` values (b may be the block count: the end).
size_t BlockOffset(size_t b, size_t count, int bits, size_t block_size);
// Bytes of the whole encoding (QuantizedBytes of quantized_allreduce.h).
size_t EncodedBytes(size_t count, int bits, size_t block_size);

// Encodes x (+ residual_in, when set) block by block into `out`; when residual_out is set it
// gets (x + residual_in) - decoded, the error feedback's new residual (a non-finite block's
// residual restarts at 0, a zero block's is its own tiny values).
void QuantizeRange(const float* x, const float* residual_in, float* residual_out, size_t count, int bits,
                   size_t block_size, uint8_t* out);

// Decodes `count` values encoded in blocks of `block_size` (QuantizeRange's layout) into `out`,
// or adds them to it (float32 addition) when `add`.
void DequantizeRange(const uint8_t* in, size_t count, int bits, size_t block_size, float* out, bool add);

// One block (count <= block size) into `out` (4 + CodeBytes(count) bytes). If `residual` is
// set, quantizes x + residual and stores (x + residual) - decoded there.
void QuantizeBlock(const float* x, size_t count, int bits, uint8_t* out, float* residual);
// out[i] = the block's value i (a NaN scale gives NaN everywhere).
void DequantizeBlock(const uint8_t* in, size_t count, int bits, float* out);
// acc[i] += the block's value i (float32 addition).
void DequantizeAddBlock(const uint8_t* in, size_t count, int bits, float* acc);

}  // namespace quantized_internal
}  // namespace gossipcc
