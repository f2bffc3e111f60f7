// Element-wise reduction kernels for CPU buffers, and float16/bfloat16 conversions; half
// precision is reduced in float32 and rounded once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/core/types.h"

namespace gossipcc {

// out[i] = op(a[i], b[i]); out may alias a or b. kAvg reduces as a sum (the caller divides).
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t count);

// Kernel for a non-half dtype; InvalidArgumentError for half dtypes and integer kAvg.
ReduceFn GetReduceFn(DType dtype, ReduceOp op);

// Throws InvalidArgumentError naming the combination when `op` cannot apply to `dtype` (avg on
// integers, bitwise ops on floating dtypes).
void CheckReduceSupported(DType dtype, ReduceOp op);

// data[i] *= factor, for float32/float64.
void ScaleInPlace(void* data, size_t count, DType dtype, double factor);

float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);  // round to nearest even; overflow -> inf; NaN preserved
float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);  // round to nearest even; NaN preserved

// Widen `count` float16/bfloat16 elements to float32.
void WidenToFloat(const void* src, DType dtype, float* dst, size_t count);
// Round `count` float32 elements (times `scale`) to float16/bfloat16.
void NarrowFromFloat(const float* src, float scale, DType dtype, void* dst, size_t count);

// Working memory ReduceInRankOrder keeps between calls (float16/bfloat16 accumulators).
struct WideScratch {
  std::vector<float> acc, next;
};

// out <- op over sources in rank order (the same bits on every rank; kAvg divides by n; half
// types in float32). `out` may alias sources[0] or [1] (any one for half types).
void ReduceInRankOrder(const std::vector<const void*>& sources, Buffer out, ReduceOp op, WideScratch& scratch);

}  // namespace gossipcc
